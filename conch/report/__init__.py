"""Looking at a run: the trajectories a run keeps (`store`), its curves (`curves`), the self-contained HTML report
(`html`), and Harbor's ATIF trajectory format (`atif`).

Why a package of its own: the training driver only hands finished trajectories and metrics to these modules (a
line per hook), so what is kept, how it is bounded and how it is shown can change without touching the loop.
"""
