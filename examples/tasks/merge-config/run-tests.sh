#!/bin/bash
# Terminal-Bench 1 style: no reward file; the harness reads pytest's -rA summary.
python3 -m pytest "$TEST_DIR/test_outputs.py" -rA
