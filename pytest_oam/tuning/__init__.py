"""Auto-tuning on the simulator (:mod:`.search`) and the knowledge base of tuned results
(:mod:`.knowledge_base`).
"""
