"""Who owns a docker sandbox, and `gc`: remove what crashed runs of the docker backend left behind.

Why labels: a conch process killed with its containers running cannot remove them. Every container, snapshot and
volume conch creates carries `io.conch.owner=<host>:<pid>:<start time>`; `gc` removes those whose process is
gone (the start time tells a reused pid from the owner) and, when asked, the cached task images no container
uses. Another machine's containers (a shared engine) are never judged from here.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from conch.sandbox import docker_images as images
from conch.sandbox.docker_images import proc_start


@dataclass
class GcReport:
    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    kept_running: int = 0  # containers of live conch processes, left alone
    verifier: list[str] = field(default_factory=list)  # verifier boxes' snapshot images and volumes


def _owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label still runs (pid reuse is caught by its start time)."""
    host, pid, start = (owner.split(":") + ["", "", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's run (shared engine): not ours to judge
    return proc_start(int(pid)) not in (None, "") and (not start or proc_start(int(pid)) == start)


def gc(everything: bool = False, remove_images: bool = False) -> GcReport:
    """Remove sandbox containers whose conch process is gone (all of them with `everything`), and with
    `remove_images` the cached task environment images and the bases of older recipes that no container uses.
    The current base image is kept."""
    import docker.errors

    report = GcReport()
    c = images.client()
    try:
        for ct in c.api.containers(all=True, filters={"label": f"{images.LABEL_KIND}=sandbox"}):
            owner = (ct.get("Labels") or {}).get(images.LABEL_OWNER, "")
            if not everything and _owner_alive(owner):
                report.kept_running += 1
                continue
            try:
                c.api.remove_container(ct["Id"], force=True)
                report.containers.append((ct.get("Names") or [ct["Id"][:12]])[0].lstrip("/"))
            except docker.errors.NotFound:
                pass
        from conch.sandbox.docker_verify import gc_leftovers  # verifier boxes' snapshot images and volumes

        report.verifier = gc_leftovers(c, lambda owner: not everything and _owner_alive(owner))
        if remove_images:
            used = {ct["ImageID"] for ct in c.api.containers(all=True)}
            for img in c.api.images(filters={"label": f"{images.LABEL_KIND}=env"}):
                if img["Id"] in used:
                    continue
                for tag in img.get("RepoTags") or [img["Id"]]:
                    try:
                        c.api.remove_image(tag, noprune=False)
                        report.images.append(tag)
                    except docker.errors.APIError:
                        pass  # used by a newer container, or a child image: keep
            current = images.base_tag()
            for img in c.api.images(name=images.BASE_REPO):
                for tag in img.get("RepoTags") or []:
                    if tag not in (current, f"{images.BASE_REPO}:latest") and img["Id"] not in used:
                        try:  # a base of an older recipe
                            c.api.remove_image(tag)
                            report.images.append(tag)
                        except docker.errors.APIError:
                            pass
            c.api.prune_images(filters={"dangling": True, "label": images.LABEL_KIND})  # untagged old bases
    finally:
        c.close()
    return report
