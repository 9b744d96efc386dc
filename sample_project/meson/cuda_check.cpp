// A stand-in for the CUDA runtime (nothing runs on a GPU here) and the test of the Meson sample's CUDA object:
// it passes when the fat binary the object registers holds exactly one cubin per target ID given on the
// command line (and their PTX), and the kernel is registered once and launched once.
#include <cstdio>
#include <cstring>

struct dim3 { unsigned x, y, z; };
struct FatbinWrapper { int magic, version; const unsigned char *data; void *unused; };

// Plain arrays: zero before any constructor runs, so the object's constructor may register first.
static unsigned cubin_archs[32], ptx_archs[32];
static int cubins, ptxs, wrappers_ok;
static const void *kernel;
static int registered, launched;

template <typename T> static T read(const unsigned char *at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

extern "C" {
void **__cudaRegisterFatBinary(const FatbinWrapper *w) {
  // fatBinaryHeader: magic 0xBA55ED50, version, header size, size of the entries; each entry: kind (1 PTX,
  // 2 cubin), version, header size, payload size, ..., the sm number at offset 28.
  static void *handle;
  const unsigned char *fatbin = w->data;
  wrappers_ok = w->magic == 0x466243b1 && read<unsigned>(fatbin) == 0xBA55ED50u;
  const unsigned char *entry = fatbin + read<unsigned short>(fatbin + 6);
  const unsigned char *end = entry + read<unsigned long long>(fatbin + 8);
  while (wrappers_ok && entry < end) {
    unsigned short kind = read<unsigned short>(entry);
    unsigned arch = read<unsigned>(entry + 28);
    if (kind == 2 && cubins < 32)
      cubin_archs[cubins++] = arch;
    else if (kind == 1 && ptxs < 32)
      ptx_archs[ptxs++] = arch;
    entry += read<unsigned>(entry + 4) + read<unsigned long long>(entry + 8);
  }
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void **) {}
void __cudaUnregisterFatBinary(void **) {}
void __cudaRegisterFunction(void **, const void *stub, char *, const char *name, int, void *, void *, void *,
                            void *, int *) {
  kernel = stub, ++registered;
  std::printf("kernel %s registered\n", name);
}
void __cudaRegisterVar(void **, char *, char *, const char *, int, unsigned long, int, int) {}
unsigned __cudaPushCallConfiguration(dim3, dim3, unsigned long, void *) { return 0; }
int __cudaPopCallConfiguration(dim3 *grid, dim3 *block, unsigned long *shared, void **stream) {
  *grid = *block = dim3{1, 1, 1}, *shared = 0, *stream = nullptr;
  return 0;
}
int cudaLaunchKernel(const void *stub, dim3, dim3, void **, unsigned long, void *) {
  launched += stub == kernel;
  return 0;
}
}

void launch_cuda_scale(float *x);  // ../cuda/src/scale.cu

int main(int argc, char **argv) {
  launch_cuda_scale(nullptr);
  bool ok = wrappers_ok && registered == 1 && launched == 1 && cubins == argc - 1;
  for (int i = 1; i < argc; ++i) {
    unsigned sm = 0;
    std::sscanf(argv[i], "sm_%u", &sm);
    int found = 0, found_ptx = 0;
    for (int e = 0; e < cubins; ++e)
      found += cubin_archs[e] == sm;
    for (int e = 0; e < ptxs; ++e)
      found_ptx += ptx_archs[e] == sm;
    std::printf("%s: %d cubin(s), %d PTX\n", argv[i], found, found_ptx);
    ok = ok && found == 1 && found_ptx == 1;
  }
  std::printf("kernel registered %d, launched %d; %d cubins: %s\n", registered, launched, cubins, ok ? "Ok" : "FAILED");
  return ok ? 0 : 1;
}
