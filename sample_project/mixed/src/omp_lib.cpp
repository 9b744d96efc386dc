// OpenMP, in the static library: a declare-target global and a target region reading it.
#pragma omp declare target
int lib_offset = 100;
#pragma omp end declare target

int omp_offset(int x) {
  int result = 0;
#pragma omp target map(from : result)
  result = x + lib_offset;
  return result;
}
