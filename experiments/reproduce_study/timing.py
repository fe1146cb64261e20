"""`make reproduce-study` timed end to end, in parts: each part's wall clock from its start to the last task
it finished (a part stopped mid-task loses that task, which the next part runs again), the tasks each part
finished and their summed task time.

    python experiments/reproduce_study/timing.py RESULTS_DIR PARTS_LOG [--before timing.json] [--out timing.json]

PARTS_LOG holds the lines run_part.sh writes (and stop_part.sh's `part stopped`, ignored here): `part start <iso> <epoch> git <sha> cpu <model>` and, where a part
ran to the end, `part end <iso> <epoch> rc <code>`. A task's finishing time is its ledger entry's
modification time (`<RESULTS_DIR>/_sweep/<task>.json`, written when the task is done). `--before`: the parts
timed in earlier sessions (this script's `--out` then; a session on a new machine restores their runs from git,
so their files' times say nothing): listed first and summed in; a part the log holds too is replaced by the
log's (running the script twice counts nothing twice).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def parts(log: Path) -> list[dict]:
    out: list[dict] = []
    for line in log.read_text().splitlines():
        words = line.split()
        if words[:2] == ["part", "start"]:
            out.append({"start": float(words[3]), "started": words[2], "git": words[5],
                        "cpu": " ".join(words[7:]) if len(words) > 7 else "", "end": None, "rc": None})
        elif words[:2] == ["part", "end"] and out:
            out[-1].update(end=float(words[3]), rc=int(words[5]))
    return out


def tasks(results: Path) -> list[dict]:
    out = []
    for ledger in sorted((results / "_sweep").glob("*.json")):
        entry = json.loads(ledger.read_text())
        if entry.get("status") == "done":
            out.append({"task": entry["task"], "seconds": float(entry["seconds"]),
                        "finished": ledger.stat().st_mtime})
    return out


def timing(results: Path, log: Path, before: list[dict] = ()) -> dict:
    runs, done = parts(log), tasks(results)
    here = {time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["start"])) for r in runs}
    rows = [dict(r) for r in before if r["started"] not in here]  # a part timed again replaces its earlier record
    since = runs[0]["start"] if runs else float("inf")  # the tasks this log's parts finished
    done_here = [t for t in done if t["finished"] >= since]
    for i, part in enumerate(runs):
        until = runs[i + 1]["start"] if i + 1 < len(runs) else float("inf")
        mine = [t for t in done if part["start"] <= t["finished"] < until]
        last = max((t["finished"] for t in mine), default=part["start"])
        wall = (part["end"] if part["end"] is not None else last) - part["start"]
        rows.append({"part": len(rows) + 1, "started": part["started"], "git": part["git"], "cpu": part["cpu"],
                     "ran_to_the_end": part["end"] is not None, "rc": part["rc"], "wall_s": round(wall, 1),
                     "tasks": len(mine), "task_s": round(sum(t["seconds"] for t in mine), 1)})
    return {"parts": rows, "wall_s": round(sum(r["wall_s"] for r in rows), 1),
            "tasks": sum(r["tasks"] for r in rows), "task_s": round(sum(r["task_s"] for r in rows), 1),
            "tasks_on_disk": len(done), "tasks_here": len(done_here),
            "finished": bool(rows) and rows[-1]["ran_to_the_end"] and rows[-1]["rc"] == 0}


def main() -> int:
    parser = argparse.ArgumentParser(description="Time `make reproduce-study`'s parts from their log and ledger.")
    parser.add_argument("results", type=Path, help="the results folder the parts ran into")
    parser.add_argument("log", type=Path, help="the parts' log (run_part.sh's lines)")
    parser.add_argument("--before", type=Path, help="the parts timed in earlier sessions (an earlier --out)")
    parser.add_argument("--out", type=Path, help="write the timing here (JSON)")
    args = parser.parse_args()
    before = json.loads(args.before.read_text())["parts"] if args.before else []
    got = timing(args.results, args.log, before)
    for r in got["parts"]:
        print(f"part {r['part']} ({r['started']}, {r['git']}, {r['cpu'] or 'cpu ?'}): {r['wall_s'] / 3600:.2f} h wall, "
              f"{r['tasks']} tasks ({r['task_s'] / 3600:.2f} task-hours)"
              + ("" if r["ran_to_the_end"] else ", stopped (its wall ends at its last finished task)"))
    state = "finished" if got["finished"] else "not finished"
    print(f"{state}: {got['wall_s'] / 3600:.2f} h wall over {len(got['parts'])} parts, {got['tasks']} tasks, "
          f"{got['task_s'] / 3600:.2f} task-hours")
    if args.out:
        args.out.write_text(json.dumps(got, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
