#pragma once
// Gradient compression policies of the data axis (DataParallel<…, WirePrecision<bf16>>,
// <…, PowerSgd>, <…, TopK>): the tags and the extension point (compression/policy.hpp) and one
// compressor per policy, each in its own file. parallel/data.hpp's GradientBuckets runs them.

#include "dpml/parallel/compression/policy.hpp"
#include "dpml/parallel/compression/powersgd.hpp"
#include "dpml/parallel/compression/topk.hpp"
#include "dpml/parallel/compression/wire_precision.hpp"
