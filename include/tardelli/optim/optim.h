#pragma once
// td::optim: optimizers, learning-rate schedules, gradient clipping.
#include "tardelli/optim/adamw.h"
#include "tardelli/optim/clip_grad.h"
#include "tardelli/optim/loss_scaler.h"
#include "tardelli/optim/lr_schedule.h"
#include "tardelli/optim/optimizer.h"
#include "tardelli/optim/sgd.h"
