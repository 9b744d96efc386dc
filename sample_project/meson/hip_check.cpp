// A stand-in for the HIP runtime (nothing runs on a GPU here) and the test of the Meson sample's HIP object:
// it passes when the fat binary the object registers holds exactly one code object per target ID given on the
// command line (besides the host entry), and the kernel is registered once and launched once.
#include <cstdio>
#include <cstring>

struct dim3 { unsigned x, y, z; };
struct FatbinWrapper { unsigned magic, version; const char *binary; void *unused; };

// Plain arrays: zero before any constructor runs, so the object's constructor may register first.
static char entry_ids[32][128];
static unsigned long long entry_count;
static const void *kernel;
static int registered, launched;

extern "C" {
void **__hipRegisterFatBinary(const FatbinWrapper *w) {
  static void *handle;
  const char *bundle = w->binary;  // __CLANG_OFFLOAD_BUNDLE__, count, then (offset, size, ID size, ID) each
  if (std::memcmp(bundle, "__CLANG_OFFLOAD_BUNDLE__", 24) == 0) {
    std::memcpy(&entry_count, bundle + 24, 8);
    unsigned long long at = 32, size;
    for (unsigned long long i = 0; i < entry_count && i < 32; ++i, at += 24 + size) {
      std::memcpy(&size, bundle + at + 16, 8);
      std::memcpy(entry_ids[i], bundle + at + 24, size < 127 ? size : 127);
    }
  }
  return &handle;
}
void __hipRegisterFunction(void **, const void *stub, char *, const char *name, int, void *, void *, void *,
                           void *, int *) {
  kernel = stub, ++registered;
  std::printf("kernel %s registered\n", name);
}
void __hipRegisterVar(void **, void *, char *, const char *, int, unsigned long, int, int) {}
void __hipUnregisterFatBinary(void **) {}
unsigned __hipPushCallConfiguration(dim3, dim3, unsigned long, void *) { return 0; }
int __hipPopCallConfiguration(dim3 *grid, dim3 *block, unsigned long *shared, void **stream) {
  *grid = *block = dim3{1, 1, 1}, *shared = 0, *stream = nullptr;
  return 0;
}
int hipLaunchKernel(const void *stub, dim3, dim3, void **, unsigned long, void *) {
  launched += stub == kernel;
  return 0;
}
}

void launch_plain(int *out);  // ../mixed/src/plain.hip

int main(int argc, char **argv) {
  launch_plain(nullptr);
  bool ok = registered == 1 && launched == 1 && entry_count == static_cast<unsigned long long>(argc);
  for (int i = 1; i < argc; ++i) {
    char id[160];
    std::snprintf(id, sizeof id, "hipv4-amdgcn-amd-amdhsa--%s", argv[i]);
    int found = 0;
    for (unsigned long long e = 0; e < entry_count && e < 32; ++e)
      found += std::strcmp(entry_ids[e], id) == 0;
    std::printf("%s: %d code object(s)\n", argv[i], found);
    ok = ok && found == 1;
  }
  std::printf("kernel registered %d, launched %d; %llu fat binary entries: %s\n", registered, launched, entry_count,
              ok ? "Ok" : "FAILED");
  return ok ? 0 : 1;
}
