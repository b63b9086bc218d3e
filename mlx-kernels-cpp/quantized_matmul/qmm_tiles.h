// The output tiles of the many-row quantized matmul kernels (common/qmm.cuh)
// and the host's choice among them. Plain C++ so that the host launcher
// (cuda.cpp), the kernels' instantiations (cuda.cu, which checks that each
// entry matches its kernel) and standalone checks read one table.
#pragma once

namespace mlx_backend::qmm {

// One kernel shape: a block computes bm × bn outputs with `threads` threads.
struct Tile {
  int bm;
  int bn;
  int threads;
  const char* name; // the kernel name's suffix
};

// f16/bf16 x (tensor cores, mma.sync m16n8k16): each warp owns a 32×32
// output block, except the 32-row tile's 16×32. Largest first.
inline constexpr Tile kHalfTiles[] = {
    {64, 128, 256, "m64n128"},
    {64, 64, 128, "m64n64"},
    {32, 64, 128, "m32n64"},
};

// f32 x (exact f32 FMA on the SIMT cores): each thread owns a 4×4 block.
inline constexpr Tile kF32Tiles[] = {
    {64, 64, 256, "m64n64"},
    {32, 64, 128, "m32n64"},
};

// The blocks a launch should have to keep every SM of a large GPU busy
// (an H100 has 132 SMs; two blocks of the largest tile fit on one).
inline constexpr long kTargetBlocks = 128;

// The index in `tiles` (largest first) for an m × n output: the largest
// tile that still makes kTargetBlocks blocks, else the smallest. Larger
// tiles dequantize each weight for more rows of x and read shared memory
// less per FMA; at prefill sizes of small models the grid, not the work per
// block, limits the kernel, so the tile shrinks until the grid fills the GPU.
template <int COUNT>
constexpr int pick_tile(const Tile (&tiles)[COUNT], long m, long n) {
  for (int i = 0; i < COUNT; i++) {
    long blocks = ((m + tiles[i].bm - 1) / tiles[i].bm) * ((n + tiles[i].bn - 1) / tiles[i].bn);
    if (blocks >= kTargetBlocks) {
      return i;
    }
  }
  return COUNT - 1;
}

} // namespace mlx_backend::qmm
