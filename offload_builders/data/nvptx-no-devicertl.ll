; An empty NVPTX module: given to the device compile as the OpenMP device runtime
; (--libomptarget-nvptx-bc-path=<this file's .bc>), so device code calls the runtime,
; which is linked once per target at link time (offload_builders.linking.nvptx_runtime).
; Rebuild: llvm-as-19 nvptx-no-devicertl.ll -o nvptx-no-devicertl.bc
source_filename = "nvptx-no-devicertl"
target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"
