"""Split sales.csv by region: out/regions.json lists them, out/regions/<r>.csv holds each."""

import csv
import json
import os

rows = list(csv.DictReader(open("sales.csv", newline="")))
regions = sorted({r["region"] for r in rows})
os.makedirs("out/regions", exist_ok=True)
for region in regions:
    with open(f"out/regions/{region}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["month", "revenue"])
        w.writeheader()
        for r in rows:
            if r["region"] == region:
                w.writerow({"month": r["month"], "revenue": r["revenue"]})
with open("out/regions.json", "w") as f:
    json.dump(regions, f)
print(f"{len(rows)} rows, {len(regions)} regions")
