"""The bundled performance suites run with ``pytest examples --oam-baseline``."""
