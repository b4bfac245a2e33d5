"""NVML return codes (nvmlReturn_t), as the C library returns them."""

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
ALREADY_INITIALIZED = 5
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
IN_USE = 19
NO_DATA = 21
INSUFFICIENT_RESOURCES = 23
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

STRINGS = {
    SUCCESS: "Success",
    UNINITIALIZED: "Uninitialized",
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    ALREADY_INITIALIZED: "Already Initialized",
    NOT_FOUND: "Not Found",
    INSUFFICIENT_SIZE: "Insufficient Size",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    TIMEOUT: "Timeout",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    FUNCTION_NOT_FOUND: "Function Not Found",
    GPU_IS_LOST: "GPU is lost",
    RESET_REQUIRED: "GPU requires restart",
    IN_USE: "In use by another client",
    NO_DATA: "No data",
    INSUFFICIENT_RESOURCES: "Insufficient resources",
    ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    UNKNOWN: "Unknown Error",
}
