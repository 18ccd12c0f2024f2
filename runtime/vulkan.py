"""Which Vulkan device ncnn would run on, named: a software rasteriser is not a GPU.

Why: with Debian's ``mesa-vulkan-drivers`` installed, ncnn reports one device, lavapipe
(``llvmpipe (LLVM 15.0.6, 256 bits)``, Vulkan device type CPU). It computes correctly but at
CPU speed, so every table that shows a Vulkan row names the device, its type and its driver,
and a software device is never reported as GPU speed. ncnn's ``GpuInfo.type()`` maps Vulkan's
``VkPhysicalDeviceType`` as 0 discrete, 1 integrated, 2 virtual, 3 cpu (ncnn ``gpu.cpp``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

DEVICE_TYPES: dict[int, str] = {0: "discrete", 1: "integrated", 2: "virtual", 3: "software"}

# PCI / Khronos vendor ids of the drivers seen in practice (VkVendorId for the non-PCI ones)
VENDORS: dict[int, str] = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x13B5: "ARM",
                           0x5143: "Qualcomm", 0x106B: "Apple", 0x10005: "Mesa"}


@dataclass(frozen=True)
class VulkanDevice:
    """One Vulkan device as ncnn enumerates it."""

    index: int
    name: str
    type: str            # discrete / integrated / virtual / software
    vendor: str
    driver_version: str

    @property
    def is_software(self) -> bool:
        """A CPU-backed implementation (lavapipe, SwiftShader): correct, never GPU speed."""
        return self.type == "software"

    @property
    def label(self) -> str:
        """How tables name the backend: ``software Vulkan (lavapipe)`` or ``Vulkan GPU <name>``."""
        if self.is_software:
            kind = "lavapipe" if "llvmpipe" in self.name.lower() else self.name
            return f"software Vulkan ({kind})"
        return f"Vulkan {self.type} GPU {self.name}"

    def describe(self) -> str:
        """One line for reports: label, name, type and driver."""
        return f"{self.label}: {self.name}, {self.type}, {self.vendor} driver {self.driver_version}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def driver_version(vendor_id: int, raw: int) -> str:
    """Vulkan's ``driverVersion`` is vendor-encoded: NVIDIA packs 10.8.8.6 bits, the others use
    the ``VK_MAKE_VERSION`` 10.10.12 layout (Mesa's lavapipe reports a plain counter)."""
    if vendor_id == 0x10DE:  # as nvidia-smi prints it: 580.159.04
        tail = raw & 0x3F
        return f"{raw >> 22}.{(raw >> 14) & 0xFF:02d}.{(raw >> 6) & 0xFF:02d}" + (f".{tail}" if tail else "")
    if vendor_id == 0x10005 or raw < (1 << 12):
        return str(raw)
    return f"{raw >> 22}.{(raw >> 12) & 0x3FF}.{raw & 0xFFF}"


def _from_info(index: int, info: Any) -> VulkanDevice:
    vendor_id = int(info.vendor_id())
    return VulkanDevice(index=index, name=str(info.device_name()),
                        type=DEVICE_TYPES.get(int(info.type()), f"unknown({int(info.type())})"),
                        vendor=VENDORS.get(vendor_id, f"0x{vendor_id:04x}"),
                        driver_version=driver_version(vendor_id, int(info.driver_version())))


@lru_cache(maxsize=1)
def vulkan_devices() -> tuple[VulkanDevice, ...]:
    """Every device ncnn sees (empty for a build without Vulkan or a machine without a driver)."""
    import ncnn
    try:
        count = int(ncnn.get_gpu_count())
        return tuple(_from_info(i, ncnn.get_gpu_info(i)) for i in range(count))
    except Exception:  # noqa: BLE001 - ncnn builds without Vulkan raise here
        return ()


def default_device() -> VulkanDevice | None:
    """The device ncnn's ``Net.set_vulkan_device(0)`` runs on, or None."""
    devices = vulkan_devices()
    return devices[0] if devices else None


def device_record() -> dict[str, Any] | None:
    """The default device for summaries (None: no Vulkan device)."""
    dev = default_device()
    return None if dev is None else dev.to_json()


def backend_label(backend: str) -> str:
    """A table's backend cell: ``cpu`` stays, ``vulkan`` names its device kind."""
    if backend != "vulkan":
        return backend
    dev = default_device()
    return "vulkan (no device)" if dev is None else f"vulkan: {dev.label}"


def device_for(backend: str) -> dict[str, Any] | None:
    """The device record a result row of ``backend`` carries (None for cpu)."""
    return device_record() if backend == "vulkan" else None


def vulkan_text(record: dict[str, Any] | None) -> str:
    """The Vulkan part of a machine line, from a stored device record (summaries from another
    machine are described by what they recorded, not by this machine's device)."""
    if not record:
        return "; no Vulkan device"
    return f"; Vulkan: {record['label']} ({record['name']}, {record['type']}, {record['vendor']} driver " \
           f"{record['driver_version']})"
