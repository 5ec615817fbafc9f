"""`trainops sandbox`: a real multi-node Slurm cluster of network-namespace nodes on this host, its
accounting, its Prometheus and the node faults the drills inject."""
