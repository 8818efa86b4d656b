// SPDX-License-Identifier: GPL-2.0
/*
 * hcatest: the VMM's bare-metal test guest (no Linux). Entered in 64-bit
 * mode by the VMM. It enumerates PCI bus 0 through configuration
 * mechanism 1, finds the hcabench HCA (1234:21a8), checks BAR2's
 * signature, programs MSI-X vector 0 to its local APIC, posts a
 * QUERY_PORT command through the mailbox, rings the command doorbell and
 * waits for its completion and an interrupt. Given a role in the exchange
 * block, it then runs the two-VM RDMA Write test (rdma.c). Every step prints a line on
 * the serial port; the last one is "HCATEST PASS" or "HCATEST FAIL <why>";
 * then it writes its verdict to the VMM's exit port.
 */
#include "hcatest.h"

#define PCI_ADDR	0xcf8
#define PCI_DATA	0xcfc
#define LAPIC		0xfee00000UL
#define MSIX_VECTOR	0x40

volatile unsigned int irq_count;
void msix_isr(void);

struct idt_entry {
	unsigned short off0, sel;
	unsigned char ist, attr;
	unsigned short off1;
	unsigned int off2, rsvd;
} __attribute__((packed));

static struct idt_entry idt[256] __attribute__((aligned(16)));

static void puts_serial(const char *s)
{
	while (*s)
		outb(COM1, *s++);
}

static void put_hex(unsigned long v)
{
	char b[19] = "0x";
	int i;

	for (i = 0; i < 16; i++)
		b[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 15];
	b[18] = 0;
	puts_serial(b);
}

void say(const char *what, unsigned long v)
{
	puts_serial("HCATEST ");
	puts_serial(what);
	puts_serial(" ");
	put_hex(v);
	puts_serial("\n");
}

void finish(const char *why)
{
	puts_serial(why ? "HCATEST FAIL " : "HCATEST PASS\n");
	if (why) {
		puts_serial(why);
		puts_serial("\n");
	}
	outb(EXIT_PORT, why ? 1 : 0);
	for (;;)
		__asm__ volatile("cli; hlt");
}

static unsigned int cfg_read(unsigned int dev, unsigned int off)
{
	outl(PCI_ADDR, 0x80000000u | dev << 11 | (off & 0xfc));
	return inl(PCI_DATA);
}

static void cfg_write(unsigned int dev, unsigned int off, unsigned int v)
{
	outl(PCI_ADDR, 0x80000000u | dev << 11 | (off & 0xfc));
	outl(PCI_DATA, v);
}

static void idt_set(int vec, void (*fn)(void))
{
	unsigned long a = (unsigned long)fn;
	struct { unsigned short limit; unsigned long base; } __attribute__((packed)) d;
	unsigned short cs;

	__asm__ volatile("mov %%cs, %0" : "=r"(cs));
	idt[vec].off0 = a & 0xffff;
	idt[vec].sel = cs;
	idt[vec].attr = 0x8e;	/* present, interrupt gate */
	idt[vec].off1 = (a >> 16) & 0xffff;
	idt[vec].off2 = a >> 32;
	d.limit = sizeof(idt) - 1;
	d.base = (unsigned long)idt;
	__asm__ volatile("lidt %0" : : "m"(d));
}

/* Finds the HCA on bus 0; its device number, or -1. */
static int find_hca(void)
{
	unsigned int dev, id;

	for (dev = 0; dev < 32; dev++) {
		id = cfg_read(dev, 0);
		if (id == 0xffffffff)
			continue;
		say("pci-device", (unsigned long)dev << 32 | id);
		if (id == (HCA_PCI_DEVICE_HCABENCH << 16 | HCA_PCI_VENDOR_HCABENCH))
			return dev;
	}
	return -1;
}

/* Vector 0 of the MSI-X table -> our LAPIC; returns 0 or an error string. */
static const char *setup_msix(int dev)
{
	unsigned int cap = cfg_read(dev, 0x34) & 0xff, hdr, table, bir;
	unsigned long base;

	while (cap && ((hdr = cfg_read(dev, cap)) & 0xff) != 0x11)
		cap = (hdr >> 8) & 0xff;
	if (!cap)
		return "no MSI-X capability";
	table = cfg_read(dev, cap + 4);
	bir = table & 7;
	base = cfg_read(dev, 0x10 + 4 * bir) & ~0xfUL;
	base += table & ~7u;
	say("msix-table", base);
	mmio_write32(base + 0, LAPIC);		/* address low: APIC ID 0 */
	mmio_write32(base + 4, 0);
	mmio_write32(base + 8, MSIX_VECTOR);	/* data: fixed, edge, vector */
	mmio_write32(base + 12, 0);		/* unmasked */
	cfg_write(dev, cap, hdr | 1u << 31);	/* MSI-X enable */
	return 0;
}

/* Role 3: reads one line from the serial port (polled) and prints it back. */
static const char *echo_line(void)
{
	char line[128];
	unsigned long spins = 0;
	unsigned int n = 0;
	char c = 0;

	puts_serial("HCATEST type a line\n");
	while (c != '\n' && n < sizeof(line) - 1) {
		if (!(inb(COM1 + 5) & 1)) {	/* LSR: data ready */
			if (++spins > 4000000000UL)
				return "no input on the serial port";
			__asm__ volatile("pause");
			continue;
		}
		c = inb(COM1);
		if (c != '\n')
			line[n++] = c;
	}
	line[n] = 0;
	puts_serial("HCATEST echo ");
	puts_serial(line);
	puts_serial("\n");
	return 0;
}

void guest_main(void)
{
	unsigned long bar0, bar2;
	unsigned int sig, peer;
	unsigned long long t0;
	unsigned long spins;
	const char *err;
	int dev;

	puts_serial("HCATEST start\n");
	dev = find_hca();
	if (dev < 0)
		finish("no HCA on PCI bus 0");
	cfg_write(dev, 4, cfg_read(dev, 4) | 0x6);	/* memory space, bus master */
	bar0 = cfg_read(dev, 0x10) & ~0xfUL;
	bar2 = (cfg_read(dev, 0x18) & ~0xfUL) | (unsigned long)cfg_read(dev, 0x1c) << 32;
	say("bar0", bar0);
	say("bar2", bar2);
	sig = mmio_read32(bar2 + HCA_BAR2_INFO_OFFSET);
	say("bar2-signature", sig);
	if (sig != HCA_SIGNATURE)
		finish("BAR2 signature is not HCAB");
	idt_set(MSIX_VECTOR, msix_isr);
	mmio_write32(LAPIC + 0xf0, 0x1ff);	/* software enable, spurious 0xff */
	err = setup_msix(dev);
	if (err)
		finish(err);
	peer = mmio_read32(bar2 + HCA_BAR2_INFO_OFFSET +
			  __builtin_offsetof(struct hca_dev_info, doorbell_peer));
	mmio_write32(bar2 + HCA_BAR2_MAILBOX_OFFSET + 0, HCA_CMD_QUERY_PORT);
	mmio_write32(bar2 + HCA_BAR2_MAILBOX_OFFSET + 4, HCA_CMD_FLAG_EVENT);
	mmio_write32(bar2 + HCA_BAR2_MAILBOX_OFFSET + 8, 1);	/* seq */
	__asm__ volatile("sti");
	mmio_write32(bar0 + 0x0c, peer << 16 | HCA_DB_CMD);
	/*
	 * Vector 0 also carries asynchronous events, so an interrupt alone does
	 * not say the command is done: wait for both (a CI run went on at the
	 * first interrupt with "done-seq 0", and rdma.c's first command then
	 * reused sequence number 1 and took QUERY_PORT's output for its own).
	 */
	for (spins = 0, t0 = rdtsc();
	     !irq_count || mmio_read32(bar2 + HCA_BAR2_MAILBOX_OFFSET + 12) != 1;)
		if (waited_too_long(&spins, t0))
			break;
	say("done-seq", mmio_read32(bar2 + HCA_BAR2_MAILBOX_OFFSET + 12));
	say("interrupts", irq_count);
	if (!irq_count)
		finish("no MSI-X interrupt after the doorbell");
	if (mmio_read32(bar2 + HCA_BAR2_MAILBOX_OFFSET + 12) != 1)
		finish("QUERY_PORT never completed");
	if (((volatile struct xchg *)XCHG_ADDR)->magic == XCHG_MAGIC &&
	    ((volatile struct xchg *)XCHG_ADDR)->role == 3)
		finish(echo_line());
	finish(rdma_test(bar0, bar2, peer));
}
