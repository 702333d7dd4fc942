"""The placeholder backend's compiler: present for discovery only; compiling is an error."""

from triton.backends.compiler import BaseBackend


class PlaceholderCPUBackend(BaseBackend):
    @staticmethod
    def supports_target(target):
        return False

    def _fail(self, *args, **kwargs):
        raise RuntimeError("conch_vllm_cpu's placeholder Triton CPU backend compiles nothing; run with "
                           "TRITON_INTERPRET=1 (conch sets it when it launches a CPU vLLM server)")

    hash = parse_options = add_stages = load_dialects = get_module_map = _fail
