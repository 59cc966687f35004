"""The gate's reports: the data (:mod:`.model`), the text (:mod:`.text`), the HTML page
(:mod:`.html`) and Chrome/Perfetto traces (:mod:`.trace`). The names of the former module
``pytest_oam.report`` are re-exported here, so that import path keeps working."""

from ..format import *
from .model import *
from .text import *
