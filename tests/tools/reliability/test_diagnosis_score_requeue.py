"""The diagnosis benchmark counts every requeue its answer recommends (issue 44 review item 7): not
only the 'a human may order requeue_job' line, but a next-step line that tells the reader to
requeue, where the case's thread says a requeue cannot help; a line that says a requeue will not
help is not a recommendation."""
from __future__ import annotations

from trainops.benchmarks.diagnosis.score import recommends_requeue


def test_a_next_step_line_that_says_requeue_counts_where_a_requeue_cannot_help():
    lines = ["next step for a network cause: check the node's IB link; exclude the node and requeue once the link "
             "is healthy"]
    assert recommends_requeue(lines, requeue_helps=False)
    assert not recommends_requeue(lines, requeue_helps=True)  # where it can help, it is not unjustified


def test_the_ordered_action_line_still_counts():
    assert recommends_requeue(["a human may order requeue_job (job_id 7): resume from the newest good checkpoint"],
                              requeue_helps=False)


def test_a_line_that_says_a_requeue_will_not_help_is_not_a_recommendation():
    lines = ["next step for a hung-peer cause: find what the missing rank was doing; a requeue waits the same time "
             "again", "next step for a software cause: read the exception; a requeue repeats it",
             "a human decides instead of requeue_job: the policy refuses it"]
    assert not recommends_requeue(lines, requeue_helps=False)


def test_a_requeue_after_a_condition_is_still_a_recommendation():
    assert recommends_requeue(["next step for a planned cause: ask who cancelled it before requeueing"],
                              requeue_helps=False)
