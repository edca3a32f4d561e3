"""Print which claims survived: verdicts.json (every sceptic's answer), kept.json (kept indexes)."""

import json

verdicts = json.load(open("verdicts.json"))
kept = json.load(open("kept.json"))
print(f"{len(kept)} of {len(verdicts)} claims survived their sceptic: {kept}")
for i, v in enumerate(verdicts):
    print(f"  claim {i}: {v.splitlines()[0] if v else '(no answer)'}")
