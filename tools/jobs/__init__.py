"""Jobs: submit, follow, read the logs of and compare the jobs trainops launches."""
