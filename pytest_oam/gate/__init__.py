"""One test's result: the gate as a pure function of its profiles, baseline and settings
(:mod:`.evaluate`), the tuned check (:mod:`.tuned`), record and replay (:mod:`.record`).
"""
