// Fused nearest-centroid kernels of dkmeans (dkmeans/kernels/backends/cuda.py).
// Defined in front of this source: the typedef `T` (the data dtype: float or double)
// and THREADS (the block size of every launch, a multiple of 32).
//
// Layout shared by all kernels: a group of `lanes` consecutive threads handles one row.
// `lanes` is a power of two <= 32, so a group never straddles a warp, and THREADS (the
// block size of every launch) is a multiple of 32, so every warp is complete. Threads
// past the last row stay alive (valid == false) and take part in the warp shuffles with
// neutral values: every shuffle below runs with all 32 lanes of the warp.

#define FULL_MASK 0xffffffffu

// float64 atomicAdd is native from compute capability 6.0; older devices use the
// compare-and-swap loop of the CUDA C++ Programming Guide.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 600
__device__ double atomic_add_f64(double* address, double val)
{
    unsigned long long int* address_as_ull = (unsigned long long int*)address;
    unsigned long long int old = *address_as_ull, assumed;
    do {
        assumed = old;
        old = atomicCAS(address_as_ull, assumed,
                        __double_as_longlong(val + __longlong_as_double(assumed)));
    } while (assumed != old);
    return __longlong_as_double(old);
}
#else
__device__ __forceinline__ double atomic_add_f64(double* address, double val)
{
    return atomicAdd(address, val);
}
#endif

// Sum of `s` over the `lanes` threads of a row group; the total lands in the group's
// lane 0 (the other lanes get partial sums).
__device__ __forceinline__ double group_sum(double s, const int lanes)
{
    for (int off = lanes >> 1; off > 0; off >>= 1)
        s += __shfl_down_sync(FULL_MASK, s, off, lanes);
    return s;
}

// out[j] = ||c_j||^2 / 2 for the k centroids: squares summed in double, rounded to T;
// exactly 1/2 for a unit centroid (|s - 1| <= UNIT_SQ_TOL), so exact ties in x.c stay ties.
extern "C" __global__ void half_sq_norms(
    const T* __restrict__ C,          // (k, d) centroids, row-major
    const int k,
    const int d,
    const int lanes,                  // threads per row
    T* __restrict__ out)              // (k,)
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / lanes;
    const int lane = (int)(tid % lanes);
    const bool valid = row < k;

    double s = 0.0;
    if (valid) {
        const T* c = C + row * (long long)d;
        for (int f = lane; f < d; f += lanes)
            s += (double)c[f] * (double)c[f];
    }
    s = group_sum(s, lanes);
    if (valid && lane == 0)
        out[row] = (T)(0.5 * (fabs(s - 1.0) <= UNIT_SQ_TOL ? 1.0 : s));
}

// One centroid block of the running nearest-centroid search over a tile of m rows.
//
// G (m x kb, row-major) is X_tile @ C_block.T from cuBLAS: G[i * kb + j] = x_i . c_(j0+j);
// c_half[j] = ||c_(j0+j)||^2 / 2 in T. The value c_half[j] - G[i, j] has the same argmin
// over j as ||x_i - c_(j0+j)||^2. Lane l of row i's group scans columns l, l + lanes, ...
// (coalesced reads) keeping its smallest value, the first one on ties; the group then
// combines its lanes (smaller value wins; equal values: lower column). Lane 0 folds the
// block's winner into best_val/best_idx: on the first block (first != 0) it writes,
// otherwise it replaces only a strictly smaller value, so an exact tie keeps the centroid
// of the earlier block, whose index is lower: one argmin over all centroids.
extern "C" __global__ void argmin_block(
    const T* __restrict__ G,        // (m, kb)
    const T* __restrict__ c_half,   // (kb,)
    const int m,                    // rows in the tile
    const int kb,                   // centroids in the block (>= 1)
    const int j0,                   // global index of the block's first centroid
    const int first,                // 1 for the tile's first block
    const int lanes,                // threads per row
    T* __restrict__ best_val,       // (m,) running minimum of ||c||^2/2 - x.c
    int* __restrict__ best_idx)     // (m,) its centroid index: the labels
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / lanes;
    const int lane = (int)(tid % lanes);
    const bool valid = row < m;

    T v = (T)0;
    int idx = -1;  // -1: no column seen (lanes >= kb, or a thread past the last row)
    if (valid) {
        const T* g = G + row * (long long)kb;
        for (int j = lane; j < kb; j += lanes) {
            const T t = c_half[j] - g[j];
            if (idx < 0 || t < v) {
                v = t;
                idx = j;
            }
        }
    }
    for (int off = lanes >> 1; off > 0; off >>= 1) {
        const T ov = __shfl_down_sync(FULL_MASK, v, off, lanes);
        const int oi = __shfl_down_sync(FULL_MASK, idx, off, lanes);
        if (oi >= 0 && (idx < 0 || ov < v || (ov == v && oi < idx))) {
            v = ov;
            idx = oi;
        }
    }
    // lane 0 scanned column 0 (kb >= 1), so idx >= 0 here for a valid row
    if (valid && lane == 0 && (first || v < best_val[row])) {
        best_val[row] = v;
        best_idx[row] = j0 + idx;
    }
}

// out[i] = ||x_i - c_labels[i]||^2 for the m rows of a tile: each difference is rounded
// in T (like NumPy's X - C[labels]); the squares are summed in double, rounded to T.
extern "C" __global__ void exact_sq(
    const T* __restrict__ X,          // (m, d) tile, row-major
    const T* __restrict__ C,          // (k, d) centroids, row-major
    const int* __restrict__ labels,   // (m,)
    const int m,
    const int d,
    const int lanes,                  // threads per row
    T* __restrict__ out)              // (m,)
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / lanes;
    const int lane = (int)(tid % lanes);
    const bool valid = row < m;

    double s = 0.0;
    if (valid) {
        const T* x = X + row * (long long)d;
        const T* c = C + (long long)labels[row] * d;
        for (int f = lane; f < d; f += lanes) {
            const T diff = x[f] - c[f];
            s += (double)diff * (double)diff;
        }
    }
    s = group_sum(s, lanes);
    if (valid && lane == 0)
        out[row] = (T)s;
}

// Folds the m rows of a tile into the float64 partials: sums[j, :] += w_i * x_i,
// counts[j] += w_i and objective += w_i * ||x_i - c_j||^2 for j = labels[i]
// (w_i = 1 when has_w == 0; w is not read then). The squared distance is the one of
// exact_sq, kept in double. The objective is summed per thread block first, then added
// with one atomic per block.
extern "C" __global__ void partials(
    const T* __restrict__ X,          // (m, d) tile, row-major
    const T* __restrict__ C,          // (k, d) centroids, row-major
    const int* __restrict__ labels,   // (m,)
    const double* __restrict__ w,     // (m,) weights, read only when has_w != 0
    const int has_w,
    const int m,
    const int d,
    const int lanes,                  // threads per row
    double* __restrict__ sums,        // (k, d), accumulated
    double* __restrict__ counts,      // (k,), accumulated
    double* __restrict__ objective)   // (1,), accumulated
{
    __shared__ double warp_total[THREADS / 32];
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / lanes;
    const int lane = (int)(tid % lanes);
    const bool valid = row < m;

    double s = 0.0;
    double wt = 0.0;
    if (valid) {
        const int j = labels[row];
        wt = has_w ? w[row] : 1.0;
        const T* x = X + row * (long long)d;
        const T* c = C + (long long)j * d;
        double* srow = sums + (long long)j * d;
        for (int f = lane; f < d; f += lanes) {
            const T xf = x[f];
            const T diff = xf - c[f];
            s += (double)diff * (double)diff;
            atomic_add_f64(srow + f, wt * (double)xf);
        }
        if (lane == 0)
            atomic_add_f64(counts + j, wt);
    }
    s = group_sum(s, lanes);

    // Block total of the objective: lane 0 of each row group holds its row's w * d2.
    double o = (valid && lane == 0) ? wt * s : 0.0;
    for (int off = 16; off > 0; off >>= 1)
        o += __shfl_down_sync(FULL_MASK, o, off);
    if ((threadIdx.x & 31) == 0)
        warp_total[threadIdx.x >> 5] = o;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int i = 0; i < THREADS / 32; ++i)
            total += warp_total[i];
        atomic_add_f64(objective, total);
    }
}
