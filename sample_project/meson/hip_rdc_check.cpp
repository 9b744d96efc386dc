// The test of the Meson sample's HIP relocatable device code: rescale_kernel (../mixed/src/rescale.hip) calls
// scaled() of another object (../mixed/src/scale.hip), so offload-link links both into one code object per gfx
// target and registers them in a HIP fat binary; ../mixed/src/hip_stub.cpp, a stand-in HIP runtime (nothing runs
// on a GPU here), checks that the kernel is registered once and launched once.
void launch_rescale(int *out);
int hip_stub_check();

int main() {
  launch_rescale(nullptr);
  return hip_stub_check() ? 0 : 1;
}
