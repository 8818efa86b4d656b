/* SPDX-License-Identifier: GPL-2.0 */
/* What the test guest's files share: port and MMIO access, serial output. */
#ifndef HCATEST_H
#define HCATEST_H

#include "../../guest-kmod/include/hca_abi.h"

#define COM1		0x3f8
#define EXIT_PORT	0x501

/*
 * The exchange block (guest-physical 0x6000), which the VMM's host side
 * reads and fills: it plays the cluster's out-of-band connection manager.
 * role 0 (or no magic): the single-VM test only; 1: RDMA writer; 2: target;
 * 3: echo one line typed on the serial console.
 */
#define XCHG_ADDR	0x6000UL
#define XCHG_MAGIC	0x47484358	/* "XCHG" */

struct xchg_side {
	__u32 ready;
	__u32 lid;
	__u32 qpn;
	__u32 rkey;
	__u64 addr;
};

struct xchg {
	__u32 magic;
	__u32 role;
	struct xchg_side self;	/* written by the guest */
	struct xchg_side peer;	/* written by the host */
};

_Static_assert(sizeof(struct xchg) == 56, "xchg");

static inline void outb(unsigned short port, unsigned char v)
{
	__asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port));
}

static inline void outl(unsigned short port, unsigned int v)
{
	__asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port));
}

static inline unsigned int inl(unsigned short port)
{
	unsigned int v;

	__asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}

static inline unsigned char inb(unsigned short port)
{
	unsigned char v;

	__asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}

static inline unsigned int mmio_read32(unsigned long a)
{
	return *(volatile unsigned int *)a;
}

static inline void mmio_write32(unsigned long a, unsigned int v)
{
	*(volatile unsigned int *)a = v;
}

/*
 * Waits are bounded in time (the TSC), not in spins: under an emulating KVM the
 * guest may run far slower, or far faster, than the host threads it waits for.
 * 60e9 cycles is 60 s at 1 GHz, 20 s at 3 GHz.
 */
#define WAIT_CYCLES	60000000000ULL

static inline unsigned long long rdtsc(void)
{
	unsigned int lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return (unsigned long long)hi << 32 | lo;
}

/* True once a wait begun at @t0 has run out (the TSC read every 4096 spins). */
static inline int waited_too_long(unsigned long *spins, unsigned long long t0)
{
	return (++*spins & 0xfff) == 0 && rdtsc() - t0 > WAIT_CYCLES;
}

void say(const char *what, unsigned long v);
void finish(const char *why);

/* rdma.c: the two-VM RDMA Write test; 0 or why it failed. */
const char *rdma_test(unsigned long bar0, unsigned long bar2, unsigned int peer);

#endif
