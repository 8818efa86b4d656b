// SPDX-License-Identifier: GPL-2.0
/* ib_device_attr can say the device has IBTA 1.5's ATOMIC WRITE (6.2+). */
#include <rdma/ib_verbs.h>

u64 hcab_conftest_atomic_write = IB_DEVICE_ATOMIC_WRITE;
