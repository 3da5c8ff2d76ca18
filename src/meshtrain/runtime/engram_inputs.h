// The Engram keys of a config as the data path's hashing takes them (data/ does not read configs): the
// training run and generation hash the tokens they feed the same way.
#pragma once

#include "meshtrain/config/config.h"
#include "meshtrain/data/engram_hash.h"

namespace meshtrain {

EngramHashOptions engram_hash_options(const Config& config);

}  // namespace meshtrain
