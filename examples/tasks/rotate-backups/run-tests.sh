#!/bin/bash
# Terminal-Bench 1 style: no reward file; the harness reads pytest's -rA summary.
cd "$TEST_DIR"
pytest test_outputs.py -rA
