// SPDX-License-Identifier: GPL-2.0
/* See ctldev.h. */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include "ctldev.h"

/* misc_open left our miscdevice in private_data. */
static struct ctldev *ctldev_of(struct file *f)
{
	return container_of(f->private_data, struct ctldev, misc);
}

static ssize_t ctldev_write(struct file *f, const char __user *ubuf, size_t len,
			    loff_t *pos)
{
	struct ctldev *c = ctldev_of(f);
	char *line, *cmd, *args;
	int err;

	if (len > 512)
		return -EINVAL;
	line = memdup_user_nul(ubuf, len);
	if (IS_ERR(line))
		return PTR_ERR(line);
	args = strim(line);
	cmd = strsep(&args, " ");
	args = args ? strim(args) : "";
	mutex_lock(&c->lock);
	c->result[0] = '\0';
	err = c->run(cmd, args);
	if (err < 0)
		scnprintf(c->result, sizeof(c->result), "error=%d\n", err);
	else if (!c->result[0])
		scnprintf(c->result, sizeof(c->result), "ok\n");
	mutex_unlock(&c->lock);
	kfree(line);
	return err < 0 ? err : len;
}

static ssize_t ctldev_read(struct file *f, char __user *ubuf, size_t len,
			   loff_t *pos)
{
	struct ctldev *c = ctldev_of(f);
	ssize_t n;

	mutex_lock(&c->lock);
	n = simple_read_from_buffer(ubuf, len, pos, c->result, strlen(c->result));
	mutex_unlock(&c->lock);
	return n;
}

/* THIS_MODULE: the module this file is compiled into. */
static const struct file_operations ctldev_fops = {
	.owner = THIS_MODULE,
	.write = ctldev_write,
	.read = ctldev_read,
	.llseek = noop_llseek,
};

int ctldev_register(struct ctldev *c, const char *name)
{
	mutex_init(&c->lock);
	c->misc.minor = MISC_DYNAMIC_MINOR;
	c->misc.name = name;
	c->misc.fops = &ctldev_fops;
	return misc_register(&c->misc);
}

void ctldev_deregister(struct ctldev *c)
{
	misc_deregister(&c->misc);
}

int ctldev_add(struct ctldev *c, struct ib_device *dev)
{
	int i;

	mutex_lock(&c->lock);
	for (i = 0; i < CTLDEV_DEVS && c->devs[i]; i++)
		;
	if (i < CTLDEV_DEVS)
		c->devs[i] = dev;
	mutex_unlock(&c->lock);
	return i < CTLDEV_DEVS ? 0 : -ENOSPC;
}

void ctldev_remove(struct ctldev *c, struct ib_device *dev,
		   void (*gone)(struct ib_device *dev))
{
	int i;

	mutex_lock(&c->lock);
	gone(dev);
	for (i = 0; i < CTLDEV_DEVS; i++)
		if (c->devs[i] == dev)
			c->devs[i] = NULL;
	mutex_unlock(&c->lock);
}

struct ib_device *ctldev_find(struct ctldev *c, const char *name)
{
	int i;

	for (i = 0; i < CTLDEV_DEVS; i++)
		if (c->devs[i] && !strcmp(dev_name(&c->devs[i]->dev), name))
			return c->devs[i];
	return NULL;
}

/* The result: the device names, space-separated. */
int ctldev_list(struct ctldev *c)
{
	int i, n = 0;

	for (i = 0; i < CTLDEV_DEVS; i++)
		if (c->devs[i])
			n += scnprintf(c->result + n, sizeof(c->result) - n, "%s ",
				       dev_name(&c->devs[i]->dev));
	scnprintf(c->result + n, sizeof(c->result) - n, "\n");
	return 0;
}
