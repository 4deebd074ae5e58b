// IgiClientCoreModule.cpp - Unreal module boilerplate for IgiClientCore (not part of the CMake build).
#include "Modules/ModuleManager.h"

IMPLEMENT_MODULE(FDefaultModuleImpl, IgiClientCore)
