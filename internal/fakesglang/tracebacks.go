package main

import "fmt"

// The failure output below follows SGLang's and PyTorch's real messages; the
// frames are abridged.

const schedulerFrames = `Traceback (most recent call last):
  File "` + sitePackages + `/sglang/srt/managers/scheduler.py", line 2731, in run_scheduler_process
    scheduler = Scheduler(
                ^^^^^^^^^^
  File "` + sitePackages + `/sglang/srt/managers/scheduler.py", line 319, in __init__
    self.tp_worker = TpModelWorker(
                     ^^^^^^^^^^^^^^
  File "` + sitePackages + `/sglang/srt/managers/tp_worker.py", line 81, in __init__
    self.model_runner = ModelRunner(
                        ^^^^^^^^^^^^
  File "` + sitePackages + `/sglang/srt/model_executor/model_runner.py", line 238, in __init__
    self.initialize(min_per_gpu_memory)
  File "` + sitePackages + `/sglang/srt/model_executor/model_runner.py", line 311, in initialize
`

const cudaOOMTraceback = schedulerFrames + `    self.init_memory_pool(
  File "` + sitePackages + `/sglang/srt/model_executor/model_runner.py", line 1190, in init_memory_pool
    self.token_to_kv_pool = MHATokenToKVPool(
                            ^^^^^^^^^^^^^^^^^
  File "` + sitePackages + `/sglang/srt/mem_cache/memory_pool.py", line 512, in _create_buffers
    torch.zeros(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 47.41 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 46.28 GiB memory in use. Of the allocated memory 45.10 GiB is allocated by PyTorch, and 512.41 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
`

const kvOOMTraceback = schedulerFrames + `    self.init_memory_pool(
  File "` + sitePackages + `/sglang/srt/model_executor/model_runner.py", line 1205, in init_memory_pool
    raise RuntimeError(
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.
`

const cudaGraphTraceback = schedulerFrames + `    self.init_device_graphs()
  File "` + sitePackages + `/sglang/srt/model_executor/model_runner.py", line 1890, in init_device_graphs
    self.graph_runner = CudaGraphRunner(self)
                        ^^^^^^^^^^^^^^^^^^^^^
  File "` + sitePackages + `/sglang/srt/model_executor/cuda_graph_runner.py", line 387, in __init__
    raise Exception(
Exception: Capture cuda graph failed: CUDA error: operation not permitted when stream is capturing
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs to a smaller value (e.g., 16)
3. disable torch compile by not using --enable-torch-compile
4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)
Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose
`

const crashTraceback = `Traceback (most recent call last):
  File "` + sitePackages + `/sglang/srt/managers/scheduler.py", line 2745, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "` + sitePackages + `/sglang/srt/managers/scheduler.py", line 1012, in event_loop_overlap
    batch_result = self.run_batch(batch)
                   ^^^^^^^^^^^^^^^^^^^^^
  File "` + sitePackages + `/sglang/srt/managers/scheduler.py", line 1950, in run_batch
    ) = self.draft_worker.forward_batch_generation(batch)
RuntimeError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
`

const noGPUTraceback = `Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "` + sitePackages + `/sglang/launch_server.py", line 11, in <module>
    launch_server(server_args)
  File "` + sitePackages + `/sglang/srt/entrypoints/http_server.py", line 1120, in launch_server
    tokenizer_manager, template_manager, scheduler_info = _launch_subprocesses(
                                                          ^^^^^^^^^^^^^^^^^^^^^
  File "` + sitePackages + `/torch/cuda/__init__.py", line 372, in _lazy_init
    torch._C._cuda_init()
RuntimeError: No CUDA GPUs are available`

func modelPathTraceback(path string) string {
	return fmt.Sprintf(`Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "%[2]s/sglang/launch_server.py", line 11, in <module>
    launch_server(server_args)
  File "%[2]s/sglang/srt/utils/hf_transformers_utils.py", line 245, in get_config
    config = AutoConfig.from_pretrained(
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "%[2]s/transformers/configuration_utils.py", line 721, in _get_config_dict
    raise EnvironmentError(
OSError: Can't load the configuration of '%[1]s'. If you were trying to load it from 'https://huggingface.co/models', make sure you don't have a local directory with the same name. Otherwise, make sure '%[1]s' is the correct path to a directory containing a config.json file`, path, sitePackages)
}

// loadTraceback is the scheduler's failure when a shard cannot be read (a safetensors
// header safe_open rejects, a file gone under it).
func loadTraceback(err error) string {
	return schedulerFrames + `    self.load_model()
  File "` + sitePackages + `/sglang/srt/model_loader/weight_utils.py", line 703, in safetensors_weights_iterator
    with safe_open(st_file, framework="pt") as f:
         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
safetensors_rust.SafetensorError: ` + err.Error() + "\n"
}
