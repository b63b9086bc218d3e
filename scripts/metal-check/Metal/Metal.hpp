// A stand-in for Apple's metal-cpp (Metal/Metal.hpp) for
// scripts/metal-check.sh: declarations of the metal-cpp types and methods
// that MLX's Metal headers and this crate's Metal host code use, so that
// both are syntax-checked on Linux with g++ -fsyntax-only. Nothing is
// defined: the real header comes with MLX's macOS wheel and the build links
// against Apple's frameworks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace NS {
using UInteger = unsigned long;
using Integer = long;

class String;
class Error;
class AutoreleasePool;

template <class T>
class SharedPtr {
 public:
  SharedPtr();
  ~SharedPtr();
  T* get() const;
  T* operator->() const;
  explicit operator bool() const;
};
} // namespace NS

namespace MTL {
enum class DataType : NS::UInteger {};

struct Size {
  Size();
  Size(NS::UInteger width, NS::UInteger height, NS::UInteger depth);
  NS::UInteger width, height, depth;
};

class Allocation {};
class Resource : public Allocation {};
class Buffer : public Resource {
 public:
  void* contents();
  NS::UInteger length() const;
};
class ResidencySet;
class Library;
class Function;
class LinkedFunctions;
class CommandQueue;
class CommandBuffer;
class Fence;
class Device;

class ComputePipelineState {
 public:
  NS::UInteger maxTotalThreadsPerThreadgroup() const;
  NS::UInteger threadExecutionWidth() const;
};

class ComputeCommandEncoder {
 public:
  void setComputePipelineState(const ComputePipelineState* state);
  void setBytes(const void* bytes, NS::UInteger length, NS::UInteger index);
  void setBuffer(const Buffer* buffer, NS::UInteger offset, NS::UInteger index);
  void setThreadgroupMemoryLength(NS::UInteger length, NS::UInteger index);
  void dispatchThreadgroups(Size grid, Size group);
};
} // namespace MTL
