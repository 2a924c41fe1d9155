#include "vramscope/gpu.h"
