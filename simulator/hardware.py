"""Hardware as data: frozen pydantic models loaded from ``simulator/hardware/*.json``.

No hardware figure appears in Python code; every group in the JSON files names its
``source`` and says which values are estimates.
"""

from __future__ import annotations

import functools
import json
import os
import re
from importlib import resources
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Group(BaseModel):
    model_config = _STRICT
    source: str = Field(min_length=1, description="Where these figures come from")


class AICoreSpec(_Group):
    count: PositiveInt = Field(description="AI Cores (Cube units) per chip")
    vector_core_count: PositiveInt = Field(description="Vector units per chip")
    clock_hz: PositiveFloat


class CubeUnitSpec(_Group):
    macs_per_cycle_per_core: dict[str, PositiveInt] = Field(
        description="Multiply-accumulates per cycle per Cube unit, by input dtype"
    )
    fractal_m: PositiveInt = Field(description="Cube fractal rows (16 on DaVinci)")
    fractal_k: PositiveInt
    fractal_n: PositiveInt
    efficiency_frac: float = Field(gt=0, le=1, description="Attainable share of peak (estimate)")
    fixpipe_bytes_per_cycle_per_core: PositiveFloat | None = Field(
        default=None, description="Bytes per cycle one Cube core's FixPipe moves from L0C to global memory: "
        "the hand-off of every score block to the Vector cores of a split Cube/Vector chip (the 910B's "
        "cube_vector_combine=split); None (the 910A, whose Vector unit reads L0C in the same core): no "
        "hand-off is charged")


class VectorUnitSpec(_Group):
    ops_per_cycle_per_core: dict[str, PositiveInt] = Field(
        description="Element operations per cycle per Vector unit, by dtype"
    )
    cycles_per_op_class: dict[str, PositiveFloat] = Field(
        description="Relative cycles per element of each instruction class (add = 1)"
    )
    efficiency_frac: float = Field(gt=0, le=1, description="Attainable share of the peak rate")


class MemorySpec(_Group):
    hbm_capacity_bytes: PositiveInt
    hbm_bandwidth_bytes_per_s: PositiveFloat
    hbm_efficiency_frac: float = Field(gt=0, le=1)
    l2_bytes: PositiveInt
    l2_bandwidth_bytes_per_s: PositiveFloat
    l1_bytes_per_core: PositiveInt
    l0a_bytes_per_core: PositiveInt
    l0b_bytes_per_core: PositiveInt
    l0c_bytes_per_core: PositiveInt
    unified_buffer_bytes_per_core: PositiveInt
    unified_buffer_block_bytes: PositiveInt = Field(description="Data block the Vector unit works on")


class DmaSpec(_Group):
    mte_startup_latency_s: PositiveFloat = Field(description="Fixed cost of one MTE transfer")
    min_efficient_transfer_bytes: PositiveInt


class LaunchSpec(_Group):
    kernel_launch_latency_s: PositiveFloat = Field(description="Launch floor of a Cube-only or Vector-only kernel")
    mix_kernel_launch_latency_s: PositiveFloat = Field(
        description="Launch floor of a kernel that runs the Cube and Vector units together (FlashAttention)"
    )
    host_dispatch_s: float = Field(
        default=0.0, ge=0,
        description="Host time to issue one kernel from eager PyTorch (Python, ATen dispatch, torch_npu's "
        "aclnn call through its task queue); the host issues kernels one after another, so kernels shorter "
        "than this leave the device idle. 0 (the default, as specs before simulator 0.4.0 had it): not modelled")
    attention_host_dispatch_s: float | None = Field(
        default=None, ge=0,
        description="Host time of one torch_npu npu_fusion_attention call (its host path runs the attention "
        "tiling and allocates four outputs), in place of host_dispatch_s for a fused attention kernel where a "
        "timed loop of such calls is simulated (simulator.validation's published loop figures); simulated steps "
        "issue every kernel host_dispatch_s apart. None (specs before simulator 0.8.0): host_dispatch_s")

    def host_s(self, mix: bool) -> float:
        """The host's time to issue one kernel: :attr:`attention_host_dispatch_s` (when given) for
        a kernel that runs the Cube and Vector units together (``mix``: fused attention), else
        :attr:`host_dispatch_s`."""
        if mix and self.attention_host_dispatch_s is not None:
            return self.attention_host_dispatch_s
        return self.host_dispatch_s


class InterconnectSpec(_Group):
    cards_per_server: PositiveInt
    hccs_group_size: PositiveInt = Field(description="Cards in one full HCCS mesh")
    hccs_link_bandwidth_bytes_per_s: PositiveFloat = Field(description="One direction, one link")
    hccs_link_latency_s: PositiveFloat
    pcie_bandwidth_bytes_per_s: PositiveFloat = Field(description="Between HCCS groups")
    pcie_latency_s: PositiveFloat
    roce_bandwidth_bytes_per_s: PositiveFloat = Field(description="Per card, between servers")
    roce_latency_s: PositiveFloat
    link_efficiency_frac: float = Field(gt=0, le=1)
    hccl_buffer_bytes: NonNegativeInt = Field(
        default=0,
        description="HBM one HCCL communicator takes outside the caching allocator, at its first "
        "collective: 2 x HCCL_BUFFSIZE (send and receive buffers)",
    )
    hccl_server_device_counts: list[PositiveInt] | None = Field(
        default=None, min_length=1,
        description="Card counts HCCL supports for a job within one server; a job across servers takes "
        "whole servers (a multiple of cards_per_server). None (specs without it): any count",
    )

    def check_device_count(self, devices: int, hardware: str) -> None:
        """Raise unless HCCL supports a job of ``devices`` cards on servers of this interconnect
        (``hardware`` names the card in the message).

        Raises:
            ValueError: ``devices`` is not one of ``hccl_server_device_counts`` nor a multiple
                of ``cards_per_server``.
        """
        counts = self.hccl_server_device_counts
        if counts is None or devices in counts or devices % self.cards_per_server == 0:
            return
        listed = ", ".join(map(str, counts[:-1])) + f" or {counts[-1]}" if len(counts) > 1 else str(counts[0])
        raise ValueError(
            f"devices={devices}: HCCL on an {hardware} server ({self.cards_per_server} cards) supports {listed} "
            f"cards in one server, or a multiple of {self.cards_per_server} across servers")


class AllocatorSpec(_Group):
    """The torch_npu caching allocator: its size rules and the host time of its calls.

    The byte constants are software facts of torch_npu's ``NPUCachingAllocator.cpp``
    (``kMinBlockSize`` and friends); the latencies are host-side costs of one call each.
    """

    min_block_bytes: PositiveInt = Field(description="kMinBlockSize: every block is a multiple")
    request_padding_bytes: NonNegativeInt = Field(
        description="Added to each request before rounding (torch_npu round_size)"
    )
    small_size_bytes: PositiveInt = Field(description="kSmallSize: largest small-pool request")
    small_buffer_bytes: PositiveInt = Field(description="kSmallBuffer: small-pool segment")
    large_buffer_bytes: PositiveInt = Field(description="kLargeBuffer: segment for 1-10 MiB requests")
    min_large_alloc_bytes: PositiveInt = Field(description="kMinLargeAlloc: own segment from here")
    round_large_bytes: PositiveInt = Field(description="kRoundLarge: large segments round to this")
    expandable_align_bytes: PositiveInt = Field(
        description="kAlignRoundLarge: start alignment of large blocks in expandable segments"
    )
    cached_alloc_latency_s: PositiveFloat = Field(description="Host bookkeeping of one allocation")
    cached_free_latency_s: PositiveFloat = Field(description="Host bookkeeping of one free")
    device_malloc_latency_s: PositiveFloat = Field(description="One aclrtMalloc call")
    device_free_latency_s: PositiveFloat = Field(description="One aclrtFree call")
    device_synchronize_latency_s: PositiveFloat = Field(
        description="Fixed cost of one device or stream synchronisation on an idle device"
    )
    page_map_latency_s: PositiveFloat = Field(
        description="Expandable segments: map one page (aclrtMallocPhysical + aclrtMapMem)"
    )
    page_unmap_latency_s: PositiveFloat = Field(
        description="Expandable segments: unmap one page (aclrtUnmapMem + aclrtFreePhysical)"
    )


class WorkspaceSpec(_Group):
    """Device workspace CANN's fused attention kernels ask for (``aclnn*GetWorkspaceSize``).

    With torch_npu's default task queue (``TASK_QUEUE_ENABLE`` 0 or 1) the workspace is a
    temporary tensor of the caching allocator: allocated after the op's outputs, right before
    the kernel is queued, and freed once it is. The constants are the tiling parameters of one
    template of CANN's FlashAttentionScore and one of FlashAttentionScoreGrad (software facts);
    shapes outside those templates' domain get no workspace model (see
    :func:`simulator.costs.op_workspace_bytes`).
    """

    flash_attention_min_kv_len: PositiveInt = Field(
        description="The forward template (S1s2Bn2gs1) serves key lengths above this; shorter ones use "
        "another template, not modelled")
    flash_attention_min_head_dim: PositiveInt = Field(
        description="Head dims up to this use fewer output buffers (not modelled)")
    flash_attention_block_rows: PositiveInt = Field(description="s1BasicBlock: query rows per score block")
    flash_attention_block_cols: PositiveInt = Field(description="s2BasicBlock: key columns per score block")
    flash_attention_score_blocks: PositiveInt = Field(
        description="nRatio: score blocks one vector core buffers per copy")
    flash_attention_score_copies: PositiveInt = Field(description="Copies of the score buffer (SPACE_NUM_2)")
    flash_attention_score_copies_unaligned: PositiveInt = Field(
        description="Copies when the key length is not a multiple of flash_attention_kv_alignment")
    flash_attention_kv_alignment: PositiveInt = Field(description="Key length alignment of the two-copy case")
    flash_attention_output_buffers: PositiveInt = Field(
        description="fp32 buffers of (block rows x aligned head dim) per vector core (SPACE_NUM_4)")
    flash_attention_head_dim_alignment: PositiveInt = Field(
        description="Head dim alignment of the output buffers and of the backward's fp32 dq, dk, dv (elements)")
    flash_attention_reserve_bytes: NonNegativeInt = Field(description="WORK_SPACE_RESERVE_SIZE, added once")
    flash_attention_grad_min_seq_len: PositiveInt = Field(
        description="The backward template (S1s2Bn2gs1s2SameAb) uses 512 x 512 blocks from this length of "
        "both sequences; shorter ones: not modelled")
    flash_attention_grad_sync_bytes: NonNegativeInt = Field(description="MUL_CORE_SYNC_BUFFER, the first term")
    flash_attention_grad_softmax_bytes_per_row: NonNegativeInt = Field(
        description="Softmax-gradient bytes per (batch, head, query row): SOFTMAX_REDUCE_SIZE x fp32")
    flash_attention_grad_block_rows: PositiveInt = Field(description="s1CvInner")
    flash_attention_grad_block_cols: PositiveInt = Field(description="s2CvInner")
    flash_attention_grad_block_copies: PositiveInt = Field(description="MATMUL_INPUT_NUM: fp32 blocks per vector core")
    flash_attention_grad_buffer_bytes: NonNegativeInt = Field(description="WORKSPACE_BUFFER, added after each part")
    flash_attention_grad_sink_pad: PositiveInt = Field(description="Sequence padding of the attention-sink term")
    flash_attention_grad_sink_block_elements: PositiveInt = Field(
        description="baseMN: score elements per fp32 value of the attention-sink term")
    gm_alignment_bytes: PositiveInt = Field(
        description="GM_ALIGN: the backward's terms are placed at (offset + size + this) // this x this")


class ProfilerSpec(_Group):
    """What collecting a profile costs the run."""

    online_callback_overhead_s: float = Field(
        ge=0, description="Host time per op when op records are delivered to callbacks while the run goes "
        "(online collection); it delays the host's next kernel issue (added to launch.host_dispatch_s), so it "
        "shows in a step only when the host is the bottleneck")
    profiled_host_dispatch_s: float | None = Field(
        default=None, ge=0,
        description="Host time to issue one kernel from eager torch_npu while torch_npu's profiler records "
        "(Level1/Level2, record_shapes), its own host overhead included: the mean host interval per kernel of "
        "such profiles (pytest_oam.calibrate.host_intervals_s; what oam calibrate fits). Replaces "
        "launch.host_dispatch_s when a simulated step is compared with such a profile (oam validate --profile's "
        "step composition); never used for an unprofiled run. None: not modelled")


class CalibratedProfile(BaseModel):
    """One real profile a calibration was fitted to."""

    model_config = _STRICT
    path: str = Field(min_length=1, description="The kernel_details.csv, as given to oam calibrate")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the file's bytes")
    kernels: NonNegativeInt = Field(description="Its kernels re-costed and used in the fit")
    host_gaps: NonNegativeInt = Field(description="Its kernel pairs on the compute stream where the device "
                                      "waited for the host (the profiled_host_dispatch_s fit)")


class OpTimeScale(BaseModel):
    """The fitted time scale of one simulator op type."""

    model_config = _STRICT
    time_scale: PositiveFloat = Field(description="Multiplies the cost model's duration of every op of this type "
                                      "(1: the base spec's model unchanged)")
    kernels: NonNegativeInt = Field(description="Kernels of this type the fit saw")
    fitted: bool = Field(description="False: fewer kernels than min_kernels, the base's scale is kept")
    median_abs_error_frac_before: float = Field(ge=0, description="Median |error| per kernel on the base spec")
    median_abs_error_frac_after: float = Field(ge=0, description="The same with the fitted scale")


class LinkRateFit(BaseModel):
    """A link rate ``oam calibrate`` fitted from a profile's communication files."""

    model_config = _STRICT
    field: str = Field(min_length=1, description="The interconnect field written (e.g. hccs_link_bandwidth_bytes_per_s)")
    achieved_bytes_per_s: PositiveFloat = Field(description="Bytes over transit time of the summed collectives")
    transit_bytes: PositiveFloat = Field(description="Bytes the links carried in the profiles")
    before_bytes_per_s: PositiveFloat = Field(description="The base spec's value of the field")
    fitted_bytes_per_s: PositiveFloat = Field(description="The value written: achieved over the spec's "
                                              "interconnect.link_efficiency_frac (the cost model applies it)")


class CalibrationSpec(_Group):
    """Provenance and fitted values of a spec written by ``oam calibrate`` (``source`` says what
    was fitted to what). ``op_time_scale`` changes what the simulator computes (in
    :func:`simulator.costs.op_cost`); the fitted host interval is written into
    ``profiler.profiled_host_dispatch_s`` only (used where a simulated step is compared with a
    profiled one), never into ``launch.host_dispatch_s``: a profile cannot separate the profiler's
    own host overhead from the host's dispatch.

    Files written by earlier versions of oam calibrate named the host interval ``host_dispatch_s_before`` /
    ``host_dispatch_s_fitted`` and wrote the fitted value into ``launch.host_dispatch_s``; they are
    read as this version writes them (:meth:`HardwareSpec._undo_launch_host_of_earlier_calibrations`):
    the fitted value as ``profiled_host_dispatch_s_fitted`` and ``profiler.profiled_host_dispatch_s``,
    ``profiled_host_dispatch_s_before`` None, and ``launch.host_dispatch_s`` the base's value the
    file recorded as ``host_dispatch_s_before``.
    """

    base_hardware: str = Field(min_length=1, description="The spec the fit started from (bundled name or path)")
    created_utc: str = Field(min_length=1, description="When the fit ran, ISO 8601 UTC")
    tool: str = Field(min_length=1, description="What wrote the file (pytest-oam and simulator versions)")
    profiles: list[CalibratedProfile] = Field(min_length=1)
    min_kernels: PositiveInt = Field(description="Fewest kernels of an op type for its scale to be fitted")
    op_time_scale: dict[str, OpTimeScale] = Field(description="Simulator op type -> its time scale")
    profiled_host_dispatch_s_before: float | None = Field(
        ge=0, description="The base spec's profiler.profiled_host_dispatch_s (None: the base has none, or a file "
        "written by an earlier oam calibrate, which recorded launch.host_dispatch_s instead)")
    profiled_host_dispatch_s_fitted: float | None = Field(
        ge=0, description="Mean host interval per kernel of the profiles (pytest_oam.calibrate.host_intervals_s: "
        "consecutive compute-stream kernels, same step, device idle between them, nothing else issued between, no "
        "collective ending in the gap), written as profiler.profiled_host_dispatch_s; None: fewer than min_kernels "
        "such pairs, the base's value is kept")
    kernels: NonNegativeInt = Field(description="Kernels re-costed over all profiles")
    median_abs_error_frac_before: float = Field(ge=0, description="Median |error| per kernel on the base spec")
    median_abs_error_frac_after: float = Field(ge=0, description="The same on this spec")
    link_files: list[str] = Field(
        default_factory=list, description="The communication files (communication_matrix.json or communication.json) "
        "found beside the profiles and read for link_rates")
    link_rates: dict[str, LinkRateFit] = Field(
        default_factory=dict, description="Transport (HCCS, PCIE, RDMA) -> the link rate fitted from the profiles' "
        "communication_matrix.json or communication.json (pytest_oam.files.communication_matrix); empty when "
        "the profile folders have neither")

    @model_validator(mode="before")
    @classmethod
    def _read_files_of_earlier_versions(cls, data: object) -> object:
        """Rename the host keys of files an earlier oam calibrate wrote (see the class)."""
        if isinstance(data, dict) and "host_dispatch_s_fitted" in data and "profiled_host_dispatch_s_fitted" not in data:
            data = dict(data)
            data["profiled_host_dispatch_s_fitted"] = data.pop("host_dispatch_s_fitted")
            data.pop("host_dispatch_s_before", None)  # the base's launch value, not a profiled one
            data.setdefault("profiled_host_dispatch_s_before", None)
        return data

    def time_scale(self, op_type: str) -> float:
        """The fitted time scale of ``op_type`` (1.0 for op types the calibration did not see)."""
        found = self.op_time_scale.get(op_type)
        return 1.0 if found is None else found.time_scale


class HardwareSpec(BaseModel):
    """One NPU model and the server it sits in. All values SI (bytes, seconds, hertz)."""

    model_config = _STRICT
    schema_version: Literal[1]
    name: str
    display_name: str
    ai_core: AICoreSpec
    cube_unit: CubeUnitSpec
    vector_unit: VectorUnitSpec
    memory: MemorySpec
    dma: DmaSpec
    launch: LaunchSpec
    interconnect: InterconnectSpec
    allocator: AllocatorSpec
    profiler: ProfilerSpec
    workspace: WorkspaceSpec | None = Field(
        default=None, description="Operator workspaces; None (specs before simulator 0.6.0): not modelled")
    calibration: CalibrationSpec | None = Field(
        default=None, description="Fitted to real profiles by oam calibrate, with their provenance; None (the "
        "bundled specs): not calibrated")

    @model_validator(mode="before")
    @classmethod
    def _undo_launch_host_of_earlier_calibrations(cls, data: object) -> object:
        """Undo what an earlier oam calibrate wrote into ``launch`` (see :class:`CalibrationSpec`):
        its fitted host interval, measured under the profiler, made every unprofiled run of the
        spec host-bound. The file recorded the base's value beside it."""
        if not isinstance(data, dict) or not isinstance(data.get("calibration"), dict):
            return data
        calibration, launch = data["calibration"], data.get("launch")
        before, fitted = calibration.get("host_dispatch_s_before"), calibration.get("host_dispatch_s_fitted")
        if "profiled_host_dispatch_s_fitted" in calibration or not isinstance(launch, dict) or fitted is None:
            return data
        if launch.get("host_dispatch_s") == fitted and before is not None:
            note = " host_dispatch_s: the base's value again (read as this version writes calibrated files)"
            restored = {**launch, "host_dispatch_s": before}
            if isinstance(launch.get("source"), str):
                restored["source"] = launch["source"] + note
            data = {**data, "launch": restored}
            if isinstance(data.get("profiler"), dict):
                data["profiler"] = {**data["profiler"], "profiled_host_dispatch_s": fitted}
        return data

    def peak_cube_flop_per_s(self, dtype: str) -> float:
        """Peak Cube unit rate in FLOP/s (2 FLOP per MAC) for ``dtype``.

        Raises:
            ValueError: the Cube unit of this hardware has no rate for ``dtype``.
        """
        return 2.0 * self.cube_macs_per_cycle(dtype) * self.ai_core.count * self.ai_core.clock_hz

    def cube_macs_per_cycle(self, dtype: str) -> int:
        try:
            return self.cube_unit.macs_per_cycle_per_core[dtype]
        except KeyError:
            known = ", ".join(sorted(self.cube_unit.macs_per_cycle_per_core))
            raise ValueError(
                f"the Cube unit of {self.name} has no {dtype} rate (supported: {known})"
            ) from None

    @property
    def vector_units_per_ai_core(self) -> int:
        """Vector units that work with one Cube unit (2 on the split 910B, 1 on the 910A)."""
        return max(1, self.ai_core.vector_core_count // self.ai_core.count)

    def vector_ops_per_cycle(self, dtype: str) -> int:
        try:
            return self.vector_unit.ops_per_cycle_per_core[dtype]
        except KeyError:
            known = ", ".join(sorted(self.vector_unit.ops_per_cycle_per_core))
            raise ValueError(
                f"the Vector unit of {self.name} has no {dtype} rate (supported: {known})"
            ) from None


def _hardware_dir():
    return resources.files("simulator") / "hardware"


def list_hardware() -> list[str]:
    """Names of the bundled hardware specs, e.g. ``["ascend910", "ascend910b", "ascend910b4"]``."""
    return sorted(p.name[: -len(".json")] for p in _hardware_dir().iterdir() if p.name.endswith(".json"))


class HardwareFileError(ValueError):
    """A hardware file that cannot be used; the one-line message names the file (and the field)."""


#: Specs read from files (:func:`load_hardware_file`) by their ``name``, so that a run's profile,
#: which names its hardware, finds its spec again in the same process (the gate's rules do).
_FILE_SPECS: dict[str, HardwareSpec] = {}
_FILE_SPEC_PATHS: dict[str, str] = {}  # name -> the real path it was read from
_FILE_CACHE: dict[tuple[str, int, int], HardwareSpec] = {}
#: What a hardware file's ``name`` may be: a plain name, never a path (it is looked up by name).
_FILE_SPEC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_hardware_path(name: str | os.PathLike) -> bool:
    """Whether ``name`` names a file rather than a bundled spec: a path object, or text ending
    in ``.json`` or holding a path separator (bundled names have neither)."""
    if not isinstance(name, str):
        return isinstance(name, os.PathLike)
    return name.lower().endswith(".json") or "/" in name or os.sep in name


def spec_name_problem(name: str) -> str:
    """What makes ``name`` unusable as a hardware file's spec name ("" when it is fine): it must be
    letters, digits, '.', '_' and '-', start with a letter or digit, and not look like a path."""
    if not _FILE_SPEC_NAME.fullmatch(name):
        return "letters, digits, '.', '_' and '-' only, starting with a letter or digit"
    if is_hardware_path(name):
        return "it would be read as a file's path (it ends in .json)"
    return ""


def load_hardware_file(path: str | os.PathLike) -> HardwareSpec:
    """Read a hardware file of the bundled files' schema (e.g. one ``oam calibrate`` wrote).

    The spec is then also found by its ``name`` (:func:`load_hardware`) in this process.

    Raises:
        HardwareFileError: no such file, unreadable, not JSON, not the schema (naming the first
            field at fault), or a ``name`` that is a bundled spec's.
    """
    where = os.fspath(path)
    try:
        stat = os.stat(where)
        key = (os.path.realpath(where), stat.st_mtime_ns, stat.st_size)
        if key in _FILE_CACHE:
            spec = _FILE_CACHE[key]
        else:
            with open(where, encoding="utf-8") as handle:
                data = json.load(handle)
            # strict: a number written as a string ("1.2") or a flag as 0/1 is a mistake, not a value
            spec = HardwareSpec.model_validate(data, strict=True)
            _FILE_CACHE[key] = spec
    except FileNotFoundError:
        raise HardwareFileError(f"{where}: no such hardware file") from None
    except IsADirectoryError:
        raise HardwareFileError(f"{where}: is a folder, not a hardware file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HardwareFileError(f"{where}: cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise HardwareFileError(f"{where}: not valid JSON: {exc.msg}{'' if exc.msg.endswith(' at') else ' at'} line {exc.lineno}, column {exc.colno}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(the top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise HardwareFileError(f"{where}: field {field}: {first['msg']}{more}; not a hardware file of "
                                "simulator/hardware/*.json's schema") from None
    problem = spec_name_problem(spec.name)
    if problem:
        raise HardwareFileError(f"{where}: field name: {spec.name!r} is not a spec name ({problem}): runs and "
                                "baselines record it")
    if spec.name in list_hardware():
        raise HardwareFileError(f"{where}: field name: {spec.name!r} is a bundled spec's name; give the file's spec "
                                "its own name, so its runs are not compared with the bundled spec's")
    real = os.path.realpath(where)
    other = _FILE_SPEC_PATHS.get(spec.name)
    if other is not None and other != real and _FILE_SPECS[spec.name] != spec:
        raise HardwareFileError(f"{where}: field name: {spec.name!r} is also the name of {other}, read before in this "
                                "process with other figures; runs name their hardware, so the two would be taken for "
                                "each other: give one of them another name (oam calibrate names the spec after -o)")
    _FILE_SPECS[spec.name] = spec
    _FILE_SPEC_PATHS[spec.name] = real
    return spec


def hardware_file_path(spec: HardwareSpec) -> str | None:
    """The real path of the file ``spec`` was read from in this process
    (:func:`load_hardware_file`); None for a bundled spec or one built in memory."""
    path = _FILE_SPEC_PATHS.get(spec.name)
    return path if path is not None and _FILE_SPECS.get(spec.name) == spec else None


def load_hardware(name: str | os.PathLike) -> HardwareSpec:
    """The spec called ``name``: a bundled spec, a path to a hardware file
    (:func:`is_hardware_path`, :func:`load_hardware_file`), or the name of a file's spec read
    before in this process.

    Raises:
        ValueError: ``name`` is not a bundled hardware spec (the message lists the known ones);
            :class:`HardwareFileError` for a file that cannot be used.
    """
    if is_hardware_path(name):
        return load_hardware_file(name)
    return _load_named(name)


def _load_named(name: str) -> HardwareSpec:
    found = _FILE_SPECS.get(name)  # never a bundled name (load_hardware_file refuses those)
    return found if found is not None else _load_bundled(name)


@functools.cache
def _load_bundled(name: str) -> HardwareSpec:
    known = list_hardware()
    if name not in known:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(known)}, or a path to a hardware file "
                         "(e.g. ./my-910b.json from oam calibrate)")
    text = (_hardware_dir() / f"{name}.json").read_text(encoding="utf-8")
    return HardwareSpec.model_validate(json.loads(text))
