// IgiNpcComponent.cpp - IgiRuntime (Unreal wrapper): session per NPC, streaming Say(), Cancel().
#include "IgiNpcComponent.h"

#include "Engine/GameInstance.h"
#include "Engine/World.h"
#include "Dom/JsonObject.h"
#include "IgiSubsystem.h"
#include "Serialization/JsonReader.h"
#include "Serialization/JsonSerializer.h"
#include "igi/client.hpp"

namespace
{
FString Utf8(const std::string& S) { return FString(UTF8_TO_TCHAR(S.c_str())); }
std::string ToUtf8(const FString& S) { return std::string(TCHAR_TO_UTF8(*S)); }
}

UIgiNpcComponent::UIgiNpcComponent()
{
	PrimaryComponentTick.bCanEverTick = true;
	PrimaryComponentTick.bStartWithTickEnabled = true;
}

UIgiSubsystem* UIgiNpcComponent::GetIgi() const
{
	const UWorld* World = GetWorld();
	UGameInstance* GameInstance = World ? World->GetGameInstance() : nullptr;
	return GameInstance ? GameInstance->GetSubsystem<UIgiSubsystem>() : nullptr;
}

void UIgiNpcComponent::TickComponent(float DeltaTime, ELevelTick TickType, FActorComponentTickFunction* ThisTickFunction)
{
	Super::TickComponent(DeltaTime, TickType, ThisTickFunction);
	if (UIgiSubsystem* Igi = GetIgi()) Igi->PumpOncePerFrame(DeltaTime);  // callbacks run here, on the game thread
}

void UIgiNpcComponent::Fail(const FString& Code, const FString& Message)
{
	GenerateId.clear();
	bSessionPending = false;
	OnError.Broadcast(Code, Message);
}

bool UIgiNpcComponent::SayWithImage(const FString& Text, const igi::Image& Image)
{
	if (IsBusy()) return false;
	PendingImage = Image;  // taken by StartGenerate, now or once the session exists
	return StartSay(Text);
}

bool UIgiNpcComponent::Say(const FString& Text)
{
	if (IsBusy()) return false;
	PendingImage.reset();
	return StartSay(Text);
}

bool UIgiNpcComponent::StartSay(const FString& Text)
{
	UIgiSubsystem* Igi = GetIgi();
	igi::Client* Client = Igi ? Igi->GetClient() : nullptr;
	if (!Client)
	{
		OnError.Broadcast(TEXT("daemon_unavailable"), TEXT("not connected to the igi daemon"));
		return false;
	}
	PendingText = Text;
	if (!SessionId.empty())
	{
		StartGenerate();
		return true;
	}
	igi::CreateSessionRequest Request;
	Request.persona = ToUtf8(Persona);
	Request.system_prompt = ToUtf8(SystemPrompt);
	Request.sampling.temperature = Temperature;
	Request.sampling.max_tokens = MaxTokens;
	Request.priority = Priority;
	if (!ReplyJsonSchema.IsEmpty()) Request.json_schema = ToUtf8(ReplyJsonSchema);
	for (const FIgiTool& Tool : Tools)
	{
		igi::Tool Wire;
		Wire.name = ToUtf8(Tool.Name);
		Wire.description = ToUtf8(Tool.Description);
		Wire.parameters = ToUtf8(Tool.ParametersJsonSchema);
		Request.tools.push_back(std::move(Wire));
	}
	TWeakObjectPtr<UIgiNpcComponent> WeakThis(this);
	TWeakObjectPtr<UIgiSubsystem> WeakIgi(Igi);
	bSessionPending = true;
	try
	{
		SessionRequestId = Client->CreateSessionAsync(
			Request,
			[WeakThis, WeakIgi](const igi::CreateSessionReply& Reply) {
				if (!WeakThis.IsValid() || WeakThis->bEndedPlay)
				{
					// The NPC went away while its session was being made: close it, or it holds a max_sessions slot
					// for as long as this client stays connected.
					igi::Client* Owner = WeakIgi.IsValid() ? WeakIgi->GetClient() : nullptr;
					if (Owner)
					{
						try
						{
							Owner->CloseSessionAsync(Reply.session_id);
						}
						catch (const igi::IgiError&)
						{
						}
					}
					return;
				}
				WeakThis->bSessionPending = false;
				WeakThis->SessionRequestId.clear();
				WeakThis->SessionId = Reply.session_id;
				WeakThis->StartGenerate();
			},
			[WeakThis](const igi::IgiError& E) {
				if (WeakThis.IsValid() && !WeakThis->bEndedPlay) WeakThis->Fail(Utf8(E.kind()), Utf8(E.what()));
			});
	}
	catch (const igi::IgiError& E)
	{
		Fail(Utf8(E.kind()), Utf8(E.what()));
		return false;
	}
	return true;
}

void UIgiNpcComponent::StartGenerate()
{
	UIgiSubsystem* Igi = GetIgi();
	igi::Client* Client = Igi ? Igi->GetClient() : nullptr;
	if (!Client)
	{
		Fail(TEXT("daemon_unavailable"), TEXT("not connected to the igi daemon"));
		return;
	}
	igi::GenerateRequest Request;
	Request.text = ToUtf8(PendingText);
	Request.max_tokens = MaxTokens;
	Request.image = std::move(PendingImage);
	PendingImage.reset();
	if (bPendingToolResult)
	{
		igi::ToolResult Result;
		Result.call_id = ToUtf8(PendingCallId);
		Result.name = ToUtf8(PendingToolName);
		Result.content = ToUtf8(PendingToolContent);
		Request.tool_result = std::move(Result);
		bPendingToolResult = false;
	}
	TWeakObjectPtr<UIgiNpcComponent> WeakThis(this);
	igi::GenerateCallbacks Callbacks;
	Callbacks.on_token = [WeakThis](const igi::TokenEvent& Token) {
		if (WeakThis.IsValid()) WeakThis->OnToken.Broadcast(Utf8(Token.text), static_cast<int32>(Token.index));
	};
	Callbacks.on_done = [WeakThis](const igi::GenerateReply& Reply) {
		if (!WeakThis.IsValid()) return;
		WeakThis->GenerateId.clear();
		WeakThis->OnReplyDone.Broadcast(Utf8(Reply.text), Utf8(Reply.finish_reason));
		if (Reply.json_output) WeakThis->OnStructuredReply.Broadcast(Utf8(*Reply.json_output));
		if (Reply.tool_call)
		{
			WeakThis->OnToolCall.Broadcast(Utf8(Reply.tool_call->id), Utf8(Reply.tool_call->name),
			                               Utf8(Reply.tool_call->arguments));
		}
	};
	Callbacks.on_error = [WeakThis](const igi::IgiError& E) {
		if (!WeakThis.IsValid()) return;
		if (E.kind() == "not_found") WeakThis->SessionId.clear();  // session expired: next Say() opens a new one
		WeakThis->Fail(Utf8(E.kind()), Utf8(E.what()));
	};
	try
	{
		GenerateId = Client->Generate(SessionId, Request, std::move(Callbacks));
	}
	catch (const igi::IgiError& E)
	{
		Fail(Utf8(E.kind()), Utf8(E.what()));
	}
}

bool UIgiNpcComponent::SendToolResult(const FString& CallId, const FString& ToolName, const FString& Content)
{
	if (IsBusy() || SessionId.empty()) return false;
	bPendingToolResult = true;
	PendingCallId = CallId;
	PendingToolName = ToolName;
	PendingToolContent = Content;
	PendingText.Empty();
	StartGenerate();
	return true;
}

FString UIgiNpcComponent::GetJsonStringField(const FString& Json, const FString& Field)
{
	TSharedPtr<FJsonObject> Object;
	const TSharedRef<TJsonReader<>> Reader = TJsonReaderFactory<>::Create(Json);
	if (!FJsonSerializer::Deserialize(Reader, Object) || !Object.IsValid()) return FString();
	FString Value;
	return Object->TryGetStringField(Field, Value) ? Value : FString();
}

void UIgiNpcComponent::Cancel()
{
	UIgiSubsystem* Igi = GetIgi();
	igi::Client* Client = Igi ? Igi->GetClient() : nullptr;
	if (!Client || GenerateId.empty()) return;
	try
	{
		Client->Cancel(GenerateId);  // the generation's own on_done reports "cancelled"
	}
	catch (const igi::IgiError& E)
	{
		OnError.Broadcast(Utf8(E.kind()), Utf8(E.what()));
	}
}

void UIgiNpcComponent::SetVramBudgetMiB(int32 VramBudgetMiB)
{
	if (UIgiSubsystem* Igi = GetIgi()) Igi->SetVramBudgetMiB(VramBudgetMiB);
}

void UIgiNpcComponent::BeginPlay()
{
	Super::BeginPlay();
	bEndedPlay = false;
}

void UIgiNpcComponent::EndPlay(const EEndPlayReason::Type EndPlayReason)
{
	UIgiSubsystem* Igi = GetIgi();
	if (igi::Client* Client = Igi ? Igi->GetClient() : nullptr)
	{
		try
		{
			if (!GenerateId.empty())
			{
				Client->Forget(GenerateId);
				Client->Cancel(GenerateId);
			}
			// a session still being made is closed by its reply's callback (bEndedPlay), not forgotten with it
			if (!SessionId.empty()) Client->CloseSessionAsync(SessionId);  // fire and forget
		}
		catch (const igi::IgiError&)
		{
			// The client is closing; the daemon frees the session when it declares us gone.
		}
	}
	bEndedPlay = true;
	GenerateId.clear();
	SessionId.clear();
	Super::EndPlay(EndPlayReason);
}
