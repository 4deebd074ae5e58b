// IgiDaemonProcess.h - IgiRuntime: the igi::ChildProcess backend built on FPlatformProcess, so the core's
// DaemonLauncher supervises the daemon bundle on every platform the engine runs on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "CoreMinimal.h"
#include "HAL/PlatformProcess.h"
#include "igi/daemon_launcher.hpp"

/** Starts `Executable` hidden, with stdout+stderr into one pipe (FPlatformProcess::CreatePipe). */
std::unique_ptr<igi::ChildProcess> SpawnIgiDaemonProcess(const std::string& Executable, const std::vector<std::string>& Arguments,
                                                         const std::string& WorkingDirectory);
