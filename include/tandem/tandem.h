/* tandem: neural networks on several devices at once. One include for all. */
#ifndef TANDEM_TANDEM_H
#define TANDEM_TANDEM_H

#include "tandem/checkpoint.h"
#include "tandem/comm.h"
#include "tandem/core.h"
#include "tandem/device.h"
#include "tandem/generate.h"
#include "tandem/import.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"
#include "tandem/status.h"
#include "tandem/strategy.h"
#include "tandem/tensor.h"
#include "tandem/tokenizer.h"
#include "tandem/train.h"

#endif
