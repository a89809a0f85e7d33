# Source this file to build and run the `tch` backend against PyTorch 2.9.0 from PyPI, CPU only.
#
#   python3 -m pip install --no-deps torch==2.9.0 nvidia-cuda-runtime-cu12==12.8.90 \
#       nvidia-cuda-cupti-cu12==12.8.90
#   source .ci/libtorch-env.sh
#
# It makes target/libtorch-cpu: torch's headers and its libraries minus the CUDA ones (the
# slim wheel set has no cuDNN, so `import torch` fails and LIBTORCH_USE_PYTORCH cannot be used),
# then exports LIBTORCH and LD_LIBRARY_PATH. torch-sys reruns its build script only when a
# LIBTORCH* variable changes, so the path is fixed.
torch_dir=$(python3 -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))") || {
    echo "libtorch-env: PyTorch is not installed (see the comment at the top of this file)" >&2
    return 1
}
root=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
libtorch="$root/target/libtorch-cpu"
mkdir -p "$libtorch/lib"
ln -sfn "$torch_dir/include" "$libtorch/include"
for f in "$torch_dir"/lib/*; do
    case "$(basename "$f")" in
        *cuda*|*nvrtc*|*nvshmem*) ;;
        *) ln -sfn "$f" "$libtorch/lib/$(basename "$f")" ;;
    esac
done
echo "2.9.0" > "$libtorch/build-version"
export LIBTORCH="$libtorch"
# libtorch_cpu loads CUPTI and the CUDA runtime from the two small nvidia-* wheels.
site=$(dirname "$torch_dir")
export LD_LIBRARY_PATH="$libtorch/lib:$site/nvidia/cuda_cupti/lib:$site/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
