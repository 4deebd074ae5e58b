// IgiRuntimeModule.cpp - IgiRuntime (Unreal wrapper): module boilerplate.
#include "Modules/ModuleManager.h"

IMPLEMENT_MODULE(FDefaultModuleImpl, IgiRuntime)
