"""The training worker's room: what one torchrun rank loads (:mod:`.train`) and the rule of what it runs
(:mod:`.support`). Nothing here imports the planner, MARP, the step-time model, the solvers or networkx
(``tests/test_layers.py`` checks the modules a rank loads)."""
