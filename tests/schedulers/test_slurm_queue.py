"""The queue view's parsers (issue 29 item 4): every user's jobs from one ``squeue``, the nodes and
partitions from one ``sinfo``, read field by field whatever a job name or node reason holds.

The literal outputs were captured from the dev cluster's Slurm 22.05.8 (``squeue --version``:
``slurm-wlm 22.05.8``) with the exact argv :func:`queue_argv`/:func:`nodes_argv` build (marker
``Q7f``): job 1125 running on n1, 1126 waiting for nodes (n2 drained, n3 down), 1127 of user
``hplother`` waiting on priority, and two held jobs whose names were submitted with
``sbatch --job-name``: ``a|b c <img src=x onerror=alert(1)>`` and ``two\\nlines|RUNNING`` (a newline
and a forged state); n3 was set DOWN with ``Reason=$'hpl|queue test\\nn9|idle'``.
"""

from __future__ import annotations

from hyperpod_lab.schedulers.slurm import (
    NODE_FIELDS,
    QUEUE_FIELDS,
    node_group,
    nodes_argv,
    parse_nodes,
    parse_queue,
    queue_argv,
    queue_marker,
)

SQUEUE = (
    "Q7f|1125|RUNNING|dev|4294900637|1|root|0:02|UNLIMITED|2026-11-27T10:37:06|n1|None|runs\n"
    "Q7f|1126|PENDING|dev|4294900636|2|root|0:00|UNLIMITED|N/A||Nodes required for job are DOWN, DRAINED or "
    "reserved for jobs in higher priority partitions|needs two\n"
    "Q7f|1127|PENDING|dev|4294900635|1|hplother|0:00|UNLIMITED|N/A||Priority|other waits\n"
    "Q7f|1121|PENDING|dev|0|1|hplother|0:00|UNLIMITED|N/A||JobHeldUser|a|b c <img src=x onerror=alert(1)>\n"
    "Q7f|1122|PENDING|dev|0|1|root|0:00|UNLIMITED|N/A||JobHeldUser|two\n"
    "lines|RUNNING\n")

SINFO = (
    "Q7f|n1|dev*|up|infinite|mixed|2|1/1/0/2|(null)|Unknown|none\n"
    "Q7f|n2|dev*|up|infinite|drained|2|0/0/2/2|(null)|2026-11-27T10:37:05|disk check\n"
    "Q7f|n3|dev*|up|infinite|down|2|0/0/2/2|(null)|2026-11-27T10:37:05|hpl|queue test\n"
    "n9|idle\n")


def test_argv_is_the_documented_letters_with_the_free_text_last():
    # squeue(1) -o: %i id, %T state, %P partition, %Q priority, %D nodes, %u user, %M time used,
    # %l limit, %S start, %N nodes, %r reason, %j name; -P "list the job once per partition" with
    # "--sort=-p,i" ("the same order considered for scheduling by Slurm"). sinfo(1) -o: %N %P %a %l
    # %T %c %C %G %H %E (the reason an operator typed last)
    assert queue_argv("M") == ["squeue", "-h", "-P", "--sort=-p,i", "-o", "M|%i|%T|%P|%Q|%D|%u|%M|%l|%S|%N|%r|%j"]
    assert nodes_argv("M") == ["sinfo", "-N", "-h", "-o", "M|%N|%P|%a|%l|%T|%c|%C|%G|%H|%E"]
    assert QUEUE_FIELDS[-1] == ("j", "name") and NODE_FIELDS[-1] == ("E", "reason")
    a, b = queue_marker(), queue_marker()
    assert a != b and a.startswith("hpl") and "|" not in a


def test_queue_rows_field_by_field_with_positions():
    jobs = parse_queue(SQUEUE, "Q7f")
    assert [j["id"] for j in jobs] == ["1125", "1126", "1127", "1121", "1122"]
    run, wait_nodes, other, held, lines = jobs
    assert run == {"id": "1125", "state": "RUNNING", "status": "running", "partition": "dev",
                   "priority": 4294900637, "nodes": 1, "user": "root", "time": "0:02", "time_limit": "UNLIMITED",
                   "start": "2026-11-27T10:37:06", "nodelist": "n1", "reason": None, "name": "runs",
                   "position": None}
    # the pending rows of partition dev, in squeue's (scheduling) order
    assert [(j["id"], j["position"]) for j in jobs[1:]] == [("1126", 1), ("1127", 2), ("1121", 3), ("1122", 4)]
    assert wait_nodes["reason"].startswith("Nodes required for job are DOWN, DRAINED")
    assert wait_nodes["start"] is None and wait_nodes["nodelist"] is None
    assert (other["user"], other["reason"], other["name"]) == ("hplother", "Priority", "other waits")
    # a name holding '|' and markup stays one field, as typed
    assert (held["reason"], held["name"], held["user"]) == ("JobHeldUser", "a|b c <img src=x onerror=alert(1)>",
                                                           "hplother")
    # a name holding a newline and a forged row: the line without the marker continues the name
    assert lines["name"] == "two\nlines|RUNNING" and lines["status"] == "pending" and len(jobs) == 5


def test_a_forged_line_never_becomes_a_row():
    # without the call's marker a line (another marker, a name's second line) is never a row
    out = "Q7f|1|PENDING|dev|5|1|u|0:00|UNLIMITED|N/A||Priority|x\nhplbad|2|RUNNING|dev|5|1|v|0:00|1:00|N/A|n1|None|y\n"
    assert [(j["id"], j["name"]) for j in parse_queue(out, "Q7f")] == [
        ("1", "x\nhplbad|2|RUNNING|dev|5|1|v|0:00|1:00|N/A|n1|None|y")]
    # a row with too few fields (another -o) is dropped, never read shifted; text before the first row too
    assert parse_queue("squeue: error: x\nQ7f|1|PENDING|dev\n", "Q7f") == []
    assert parse_queue("", "Q7f") == []


def test_positions_count_per_partition_and_only_pending_rows():
    out = ("M|1|RUNNING|a|9|1|u|1:00|UNLIMITED|x|n1|None|r\n"
           "M|2|PENDING|a|8|1|u|0:00|UNLIMITED|N/A||Priority|p\n"
           "M|3|PENDING|b|8|1|u|0:00|UNLIMITED|N/A||Resources|q\n"
           "M|4|PENDING|a|7|1|u|0:00|UNLIMITED|N/A||Priority|s\n"
           "M|5|COMPLETING|a|7|1|u|0:00|UNLIMITED|N/A|n2|None|t\n")
    assert [(j["id"], j["position"]) for j in parse_queue(out, "M")] == [
        ("1", None), ("2", 1), ("3", 1), ("4", 2), ("5", None)]


def test_nodes_and_partitions_with_reasons():
    nodes, parts = parse_nodes(SINFO, "Q7f")
    assert [(n["name"], n["state"], n["group"]) for n in nodes] == [
        ("n1", "mixed", "mixed"), ("n2", "drained", "drain"), ("n3", "down", "down")]
    n1, n2, n3 = nodes
    assert (n1["cpus"], n1["cpus_alloc"], n1["cpus_idle"], n1["reason"], n1["reason_time"], n1["gres"]) == (
        2, 1, 1, None, None, None)
    assert (n2["reason"], n2["reason_time"]) == ("disk check", "2026-11-27T10:37:05")
    # the operator's reason, '|' and newline included, is one field; no node "n9" is forged
    assert n3["reason"] == "hpl|queue test\nn9|idle"
    assert parts == [{"name": "dev", "default": True, "avail": "up", "time_limit": "infinite",
                      "nodes": ["n1", "n2", "n3"], "counts": {"mixed": 1, "drain": 1, "down": 1}}]


def test_a_node_in_two_partitions_is_one_node():
    out = "M|n1|a*|up|infinite|idle|2|0/2/0/2|gpu:1|Unknown|none\nM|n1|b|down|1:00:00|idle|2|0/2/0/2|gpu:1|Unknown|none\n"
    nodes, parts = parse_nodes(out, "M")
    assert len(nodes) == 1 and nodes[0]["partitions"] == ["a", "b"] and nodes[0]["gres"] == "gpu:1"
    assert [(p["name"], p["default"], p["avail"], p["counts"]) for p in parts] == [
        ("a", True, "up", {"idle": 1}), ("b", False, "down", {"idle": 1})]


def test_node_groups_follow_sinfo_state_codes():
    # sinfo(1) NODE STATE CODES: a flag after the state; '*' "not responding"
    assert [node_group(s) for s in ("idle", "allocated", "allocated+", "mixed", "down*", "drained", "draining",
                                    "completing", "idle~", "idle*", "mixed-", "future", "drained*")] == [
        "idle", "alloc", "alloc", "mixed", "down", "drain", "drain", "alloc", "idle", "down", "mixed", "other",
        "drain"]
