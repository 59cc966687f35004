"""Pure: Profiles in, verdicts and findings out (summaries, pairing of runs, comparison,
explanation of a regression, diagnosis rules, thresholds, severity). Imports neither pytest,
the reports, the gate nor the simulator's runtime: the same code judges simulated profiles and
imported real traces.
"""
