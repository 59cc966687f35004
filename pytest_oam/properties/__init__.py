"""Performance properties over shapes: measurements and assertions (:mod:`.perf`), grids
(:mod:`.sweep`), Hypothesis strategies (:mod:`.strategies`).
"""
