// The cuBLAS subset kvserve calls, for KVSERVE_CUDA_EMU builds: handles,
// stream and math-mode setters, and cublasGemmEx for the one combination the
// forward uses (bf16 x bf16 -> fp32 with fp32 compute, any transposes),
// computed on the CPU in fp32 (column-major, like cuBLAS). Anything else is
// CUBLAS_STATUS_NOT_SUPPORTED, so a new call site fails loudly here.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstring>
#include <vector>

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// An operand as fp32 rows along k: r[o][kk] = m[o * ld + kk] when k is the
// fast index of the stored column-major matrix (`k_fast`), else
// m[kk * ld + o]. Both GEMM operands then read k contiguously.
std::vector<float> AlongK(const uint16_t* m, int ld, bool k_fast, int outer,
                          int k) {
  // op(M) is (outer x k) for A, (k x outer) for B; either way we want
  // r[o][kk] = the element multiplying along k for output index o.
  std::vector<float> r(static_cast<size_t>(outer) * k);
  for (int o = 0; o < outer; ++o) {
    for (int kk = 0; kk < k; ++kk) {
      const size_t idx = k_fast ? static_cast<size_t>(o) * ld + kk
                                : static_cast<size_t>(kk) * ld + o;
      r[static_cast<size_t>(o) * k + kk] = Bf16ToFloat(m[idx]);
    }
  }
  return r;
}

// Dot product of two fp32 rows of length k in 16 running sums, added
// pairwise at the end: the compiler keeps them in vector registers, where a
// single sum is a chain of dependent adds it may not reorder (scalar, about
// ten times slower; the emulated forward spent most of its time here).
float Dot(const float* x, const float* y, int k) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += x[p + l] * y[p + l];
  }
  for (int l = 0; p < k; ++p, ++l) acc[l] += x[p] * y[p];
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

}  // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED
                           : CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS_UNKNOWN (emulator)";
  }
}

// C (m x n, column-major, ldc) = alpha op(A) (m x k) op(B) (k x n) + beta C.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k,
                            const void* alpha, const void* A,
                            cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta,
                            void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType,
                            cublasGemmAlgo_t /*algo*/) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F ||
      computeType != CUBLAS_COMPUTE_32F || transa == CUBLAS_OP_C ||
      transb == CUBLAS_OP_C) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if (m < 0 || n < 0 || k < 0 || lda < (ta ? k : m) || ldb < (tb ? n : k) ||
      ldc < m) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float a = *static_cast<const float*>(alpha);
  const float b = *static_cast<const float*>(beta);
  // op(B)[p][j] = tb ? B[j + p*ldb] : B[p + j*ldb], as n rows along k (n is
  // the token count: small). op(A)[i][p] = ta ? A[p + i*lda] : A[i + p*lda],
  // converted one row at a time (A is the weight matrix: large).
  const std::vector<float> bk =
      AlongK(static_cast<const uint16_t*>(B), ldb, !tb, n, k);
  const uint16_t* am = static_cast<const uint16_t*>(A);
  float* c = static_cast<float*>(C);
  std::vector<float> arow(k);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      arow[p] = Bf16ToFloat(ta ? am[static_cast<size_t>(i) * lda + p]
                               : am[i + static_cast<size_t>(p) * lda]);
    }
    for (int j = 0; j < n; ++j) {
      const float acc =
          Dot(arow.data(), bk.data() + static_cast<size_t>(j) * k, k);
      float& out = c[static_cast<size_t>(j) * ldc + i];
      out = b == 0.0f ? a * acc : a * acc + b * out;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
