"""Engine-agnostic data plane: where a block's bytes sit in a host-pool row, and the copy
engine that moves them (no vLLM import; the vLLM worker adapter drives it)."""
