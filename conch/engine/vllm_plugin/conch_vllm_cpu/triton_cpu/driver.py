"""The placeholder backend's driver: never active."""

from triton.backends.driver import DriverBase


class PlaceholderCPUDriver(DriverBase):
    @classmethod
    def is_active(cls):
        return False

    def _fail(self, *args, **kwargs):
        raise RuntimeError("conch_vllm_cpu's placeholder Triton CPU driver is never active")

    map_python_to_cpp_type = get_current_target = get_active_torch_device = get_benchmarker = _fail
