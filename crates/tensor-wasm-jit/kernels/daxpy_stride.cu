// Double-precision a * x + y over a grid-stride loop: any grid covers any n.
extern "C" __global__ void daxpy_stride(const double* x, double* y, double a, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = a * x[i] + y[i];
    }
}
