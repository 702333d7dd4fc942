"""Print a stock report: one line per item, then the total stock value."""

import csv
import sys

LOW_LIMIT = 3
SORT_KEY = "qty"


def main(path: str) -> None:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    total = 0.0
    for row in rows:
        qty, price = int(row["qty"]), float(row["price"])
        total += price
    for row in sorted(rows, key=lambda r: r[SORT_KEY]):
        flag = " LOW" if int(row["qty"]) < LOW_LIMIT else ""
        print(f"{row['name']}: {row['qty']}{flag}")
    print(f"TOTAL: {total:.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "stock.csv")
