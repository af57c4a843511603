"""Files the lab writes on the host, each replaced atomically (a reader never sees half of one)."""
import os
import shutil
import subprocess


def write_text(path, text, mode=0o644):
    tmp = path + ".new"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def install_file(src, dst, mode):
    tmp = dst + ".new"
    shutil.copyfile(src, tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, dst)


def write_sudoers(path, rule):
    """A sudoers drop-in, checked by visudo before it is put in place (a broken one stops sudo)."""
    tmp = path + ".new"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(rule)
    os.chmod(tmp, 0o440)
    subprocess.run(["visudo", "-cqf", tmp], check=True)
    os.replace(tmp, path)
