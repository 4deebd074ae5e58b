// IgiDaemonProcess.cpp - IgiRuntime: FPlatformProcess backend of igi::ChildProcess.
#include "IgiDaemonProcess.h"

namespace
{
class FIgiDaemonProcess final : public igi::ChildProcess
{
public:
	FIgiDaemonProcess(FProcHandle InHandle, uint32 InPid, void* InReadPipe, void* InWritePipe)
		: Handle(InHandle), Pid(InPid), ReadPipe(InReadPipe), WritePipe(InWritePipe) {}

	virtual ~FIgiDaemonProcess() override
	{
		if (Handle.IsValid() && FPlatformProcess::IsProcRunning(Handle)) FPlatformProcess::TerminateProc(Handle, true);
		if (Handle.IsValid()) FPlatformProcess::CloseProc(Handle);
		FPlatformProcess::ClosePipe(ReadPipe, WritePipe);
	}

	virtual std::int64_t pid() const override { return static_cast<std::int64_t>(Pid); }

	virtual bool Exited(int* ExitCode) override
	{
		if (FPlatformProcess::IsProcRunning(Handle)) return false;
		int32 Code = -1;
		FPlatformProcess::GetProcReturnCode(Handle, &Code);
		*ExitCode = Code;
		return true;
	}

	virtual void ReadLines(std::vector<std::string>* Lines) override
	{
		const FString Chunk = FPlatformProcess::ReadPipe(ReadPipe);
		if (Chunk.IsEmpty()) return;
		Pending += std::string(TCHAR_TO_UTF8(*Chunk));
		std::size_t Start = 0;
		for (std::size_t Nl; (Nl = Pending.find('\n', Start)) != std::string::npos; Start = Nl + 1)
		{
			std::string Line = Pending.substr(Start, Nl - Start);
			if (!Line.empty() && Line.back() == '\r') Line.pop_back();
			Lines->push_back(Line);
		}
		Pending.erase(0, Start);
	}

	// The engine has no portable "please exit" for a child process: Stop() sends shutdown_request through the
	// connected client first, and kills otherwise.
	virtual bool Terminate() override { return false; }

	virtual void Kill() override
	{
		if (FPlatformProcess::IsProcRunning(Handle)) FPlatformProcess::TerminateProc(Handle, true);
	}

private:
	FProcHandle Handle;
	uint32 Pid = 0;
	void* ReadPipe = nullptr;
	void* WritePipe = nullptr;
	std::string Pending;
};
}  // namespace

std::unique_ptr<igi::ChildProcess> SpawnIgiDaemonProcess(const std::string& Executable, const std::vector<std::string>& Arguments,
                                                         const std::string& WorkingDirectory)
{
	void* ReadPipe = nullptr;
	void* WritePipe = nullptr;
	if (!FPlatformProcess::CreatePipe(ReadPipe, WritePipe))
	{
		throw igi::LaunchError("cannot create the daemon's output pipe");
	}
	const FString Exe = UTF8_TO_TCHAR(Executable.c_str());
	const FString Args = UTF8_TO_TCHAR(igi::JoinCommandLine(Arguments).c_str());
	const FString Dir = UTF8_TO_TCHAR(WorkingDirectory.c_str());
	uint32 Pid = 0;
	FProcHandle Handle = FPlatformProcess::CreateProc(*Exe, *Args, /*bLaunchDetached*/ false, /*bLaunchHidden*/ true,
		/*bLaunchReallyHidden*/ true, &Pid, /*PriorityModifier*/ 0, Dir.IsEmpty() ? nullptr : *Dir, WritePipe);
	if (!Handle.IsValid())
	{
		FPlatformProcess::ClosePipe(ReadPipe, WritePipe);
		throw igi::LaunchError("cannot start " + Executable);
	}
	return std::make_unique<FIgiDaemonProcess>(Handle, Pid, ReadPipe, WritePipe);
}
