"""What is read and written: safe file access (:mod:`.fileio`), baseline files
(:mod:`.baseline`), real profiler output (:mod:`.importers`).
"""
