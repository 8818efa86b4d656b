// SPDX-License-Identifier: GPL-2.0
/*
 * hcab_virtio_mmio: registers the virtio-mmio devices hcabench's VMM announces on the kernel
 * command line (virtio_mmio.device=<size>@<base>:<irq>, the syntax of upstream's
 * CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES), for kernels built without that option (Debian's 6.1
 * and 6.12): userland-up passes this module the same values as
 * device=<size>@<base>:<irq>[,...], and virtio_mmio's platform driver binds the devices.
 */
#include <linux/ioport.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/platform_device.h>

#define HCAB_VMMIO_MAX 5

static char *device[HCAB_VMMIO_MAX];
static int ndevice;
module_param_array(device, charp, &ndevice, 0400);
MODULE_PARM_DESC(device, "<size>@<base>:<irq> as in virtio_mmio.device=, up to 5, comma-separated");

static struct platform_device *hcab_vmmio_pdev[HCAB_VMMIO_MAX];

/* Parses "<size>@<base>:<irq>" (size with memparse's K/M/G suffixes) into a memory and an
 * IRQ resource. */
static int hcab_vmmio_parse(const char *s, struct resource res[2])
{
	long long base;
	unsigned int irq;
	int used = 0;
	char *end;
	u64 size = memparse(s, &end);

	if (!size || *end != '@')
		return -EINVAL;
	if (sscanf(end + 1, "%lli:%u%n", &base, &irq, &used) != 2 || end[1 + used] != '\0' ||
	    base < 0)
		return -EINVAL;
	res[0].start = base;
	res[0].end = base + size - 1;
	res[0].flags = IORESOURCE_MEM;
	res[1].start = irq;
	res[1].end = irq;
	res[1].flags = IORESOURCE_IRQ;
	return 0;
}

static int __init hcab_vmmio_init(void)
{
	int i, err;

	for (i = 0; i < ndevice; i++) {
		struct resource res[2] = {};
		struct platform_device *pdev;

		err = hcab_vmmio_parse(device[i], res);
		if (err) {
			pr_err("hcab_virtio_mmio: device=%s: want <size>@<base>:<irq>\n", device[i]);
			goto err_unregister;
		}
		pdev = platform_device_register_simple("virtio-mmio", i, res, ARRAY_SIZE(res));
		if (IS_ERR(pdev)) {
			err = PTR_ERR(pdev);
			goto err_unregister;
		}
		hcab_vmmio_pdev[i] = pdev;
		pr_info("hcab_virtio_mmio: virtio-mmio.%d at %pR, irq %u\n", i, &res[0],
			(unsigned int)res[1].start);
	}
	return 0;

err_unregister:
	while (i--)
		platform_device_unregister(hcab_vmmio_pdev[i]);
	return err;
}

static void __exit hcab_vmmio_exit(void)
{
	int i;

	for (i = ndevice; i--;)
		platform_device_unregister(hcab_vmmio_pdev[i]);
}

module_init(hcab_vmmio_init);
module_exit(hcab_vmmio_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("virtio-mmio devices named on the kernel command line (hcabench's VMM)");
