#pragma once
// td::nn: the module system and its layers.
#include "tardelli/nn/activation.h"
#include "tardelli/nn/container.h"
#include "tardelli/nn/dropout.h"
#include "tardelli/nn/embedding.h"
#include "tardelli/nn/linear.h"
#include "tardelli/nn/module.h"
#include "tardelli/nn/norm.h"
