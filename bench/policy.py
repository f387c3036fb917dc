"""Policy evaluation: what a tool's CEL rules cost on every call, with 20 of them.

    python -m bench.policy [--calls 20000]

The worst case of first-match-wins: 19 rules that do not match, the 20th that does, all
over the call's arguments, timed through `Policy.for_call` exactly as the approval
middleware calls it (compiled programs cached, as after start). The target is under
0.2 ms per call: nothing next to the database round trip each call makes anyway.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from agent.policy import Policy
from storage.policy_spec import Rule

RESULTS = Path(__file__).parent / "results-policy.json"
TARGET_MS = 0.2
RULES = 20


def twenty_rules() -> Policy:
    """19 rules a typical call does not match, then one it does."""
    misses = [
        Rule(when=f'args.amount > {100_000 + i} && args.toAccount.startsWith("{i:05d}")')
        for i in range(RULES - 1)
    ]
    hit = Rule(when='args.amount > 100 && requester != "" && tool == "transferMoney"', approvals=2)
    return Policy(tool="transferMoney", allowed=False, channel="C0FIN", rules=(*misses, hit))


def run(calls: int = 20_000) -> dict[str, Any]:
    policy = twenty_rules()
    args = {"amount": 5000, "toAccount": "12345", "memo": "rent"}
    assert policy.for_call(args, "UASK").approvals == 2  # and every rule compiled
    batches = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls // 5):
            policy.for_call(args, "UASK")
        batches.append((time.perf_counter() - started) / (calls // 5) * 1000)
    per_call = statistics.median(batches)
    result = {
        "rules": RULES,
        "calls": calls,
        "ms_per_call": round(per_call, 4),
        "target_ms": TARGET_MS,
        "met": per_call < TARGET_MS,
    }
    verdict = "met" if result["met"] else "MISSED"
    print(
        f"policy evaluation, {RULES} rules, 20th matches: {per_call * 1000:.1f} us per call "
        f"(target < {TARGET_MS * 1000:.0f} us: {verdict})"
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    run(parser.parse_args().calls)


if __name__ == "__main__":
    main()
