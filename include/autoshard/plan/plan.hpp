#pragma once
/// The plan area: the plan document (a solved plan as a value), its one writer and its one
/// reader, with a versioned schema (docs/plan-format.md, docs/plan.schema.json).
#include "algo.hpp"      // algo: how the pass chose
#include "document.hpp"  // plan_document, read_plan_file, write_plan_file
#include "pipeline.hpp"  // plan_pipeline: a pipelined plan's stages and schedule
