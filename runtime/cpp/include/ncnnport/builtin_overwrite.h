// Registering a replacement for one of ncnn's built-in layer types on a Net, without ncnn's log
// line: shared by the InnerProduct (gemv_layer.h) and MatMul (matmul_layer.h) overwrites.
#pragma once

#include <layer.h>  // ncnn
#include <net.h>

namespace ncnnport {

// net.register_custom_layer(type, ...) with stderr pointed at /dev/null for the call: ncnn logs
// every overwrite of a built-in type ("overwrite built-in layer type ..."), one line per graph of
// every run, while the runs report their overwrites themselves (gemv_json / matmul_json). Graphs
// are opened before any worker thread writes to stderr. True when ncnn accepted it.
bool register_overwrite_quietly(ncnn::Net& net, const char* type, ncnn::layer_creator_func creator,
                                ncnn::layer_destroyer_func destroyer);

// register_overwrite_quietly with a creator and destroyer of layer class L.
template <typename L>
bool register_overwrite_of(ncnn::Net& net, const char* type) {
    return register_overwrite_quietly(net, type, [](void*) -> ncnn::Layer* { return new L; },
                                      [](ncnn::Layer* layer, void*) { delete layer; });
}

// An overwrite keeps ncnn's built-in layer for every case its kernel does not take; it takes the
// built-in's storage and packing flags (after the built-in's load_param set them) so ncnn feeds
// both the same blobs.
void adopt_builtin_flags(ncnn::Layer& overwrite, const ncnn::Layer& builtin);

}  // namespace ncnnport
